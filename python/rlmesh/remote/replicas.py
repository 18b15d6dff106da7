"""Several servers of one model: ``ReplicaSet`` decides which replica answers each episode,
which replicas are alive, and what an episode moved off a lost replica must send again.

The three served-model clients (``RemoteModel`` over rlmesh-wire-v1, ``OpenPIModel`` and
``VlaEvalModel``) take ``replicas=[address, ...]``: more servers of the same model, beside the
primary ``address`` (a model served on several GPUs). Each client holds one ``ReplicaSet`` and
hands it every call (``ReplicaSet.ask``): the set splits the rows by replica, and the client
only speaks its protocol to each replica, concurrently, and says what each answered.

**Routing is by episode, and sticky.** An episode's first request goes to the live replica
with the fewest running episodes (the first given on a tie), and every later request of the
episode to that same replica, until the episode ends. So every server sees each of its
episodes whole and in order, as a lone server would, and the per-episode results do not
depend on the number of replicas, also for a served model that keeps per-episode state: a
corner's ``context`` (its ``state``, its ``predict_index`` and so its ``predict_seed``) on
rlmesh's servers, a vla-eval server that replays its chunks itself, rlmesh's openpi server,
which takes a connection as an episode. Rows outside any episode (not part of a run) go
round-robin.

**A lost replica.** A replica is lost when it cannot be reached, drops its connection or
stream, closes it going away, answers that it is closing, or (the WebSocket clients) sends
nothing within ``timeout_s``: the failures the clients raise as ``ReplicaLostError``. An
answer that is an error (the model raised, a malformed request, a wrong key) is no loss: it
fails the call as it would with one server, since another replica of the same model would
fail alike. A lost replica stays dead until the model is closed (a later run dials it again),
and its running episodes move: each goes, at its next request, to a live replica as a new
episode would, and that replica is first sent the episode's earlier requests again, in order,
their answers dropped, so it is where the lost one was before it answers the request that
was lost. An rlmesh-wire-v1 server that hangs without dying is no loss: the run's
``timeouts={"predict": ...}`` ends it.

Why replay, rather than moving an episode only at its end or refusing stateful models: a lost
replica cannot finish its episodes, and no handshake of the three protocols says whether the
served model keeps per-episode state, so replaying is the one way that is exact either way.
Its costs: while there are several replicas, the client keeps each running episode's requests
until the episode ends (openpi: the packed messages; vla-eval: the observations; rlmesh-wire-v1:
the episode's row of each payload), so T requests of B bytes hold T*B (two 224x224 images and
a state: about 0.3 MB a request, 30 MB for an episode of 100 predictions); and on a loss, the
moved episodes' earlier requests are inferred again.

With one address nothing of this happens: no request is kept, and a loss is raised as it is.
With several, the call fails when the last replica is lost, with a ``RemoteError`` naming
every replica and the error that lost it.

Example:
    >>> replicas = ReplicaSet(["tcp://a:1", "tcp://b:2"])
    >>> def answer(groups, replays):  # each replica answers its rows with its own name
    ...     return {replica: ["ab"[replica]] * len(rows) for replica, rows in groups.items()}
    >>> replicas.ask(["e0", "e1", "e2"], answer, keep=lambda row: f"request {row}")
    ['a', 'b', 'a']
    >>> def b_is_gone(groups, replays):
    ...     print("replayed:", replays)
    ...     return {
    ...         replica: ReplicaLostError("b went away", address="tcp://b:2") if replica else ["a"]
    ...         for replica in groups
    ...     }
    >>> replicas.ask(["e1"], b_is_gone)
    replayed: {}
    replayed: {0: ['request 1']}
    ['a']
    >>> replicas.live(), replicas.ask(["e1"], b_is_gone)  # e1 stays on replica 0
    replayed: {}
    ([0], ['a'])
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from ..errors import RemoteError
from ..utils import map_leaves

Groups = dict[int, list[int]]
"""Rows by replica: ``{replica: [row, ...]}``, replicas and rows in order."""
Send = Callable[[Groups, dict[int, list[Any]]], dict[int, Any]]
"""What a client does with one call's ``Groups`` and its replays (``{row: [earlier request,
...]}``): asks every replica its rows at once, and returns, by replica, its rows' answers in
order or the exception that ended its part."""


class ReplicaLostError(RemoteError):
    """A served model's server is lost: it could not be reached, dropped its connection or
    stream, went away, said it is closing, or sent nothing in time. With replicas, its
    episodes move to another (``rlmesh.remote.replicas``); with one server, the run fails
    with it, as with any ``RemoteError``."""

    @classmethod
    def from_error(cls, error: RemoteError) -> ReplicaLostError:
        """``error`` (message, address, code and detail kept) as a loss."""
        return cls(str(error), address=error.address, code=error.code, detail=error.detail)


class ReplicaSet:
    """The replicas of one served model, by index (0 the primary): which are alive, which
    running episode each serves, and each running episode's requests while a loss could
    move it.

    Used from one thread at a time (the driver's). ``ask`` runs a call; ``each`` runs a step
    on every live replica (a load, a handshake); ``end`` ends an episode; ``lose`` marks a
    loss found elsewhere; ``reset`` forgets the losses and the episodes (the model closed).

    Args:
        addresses: every server, the primary first; each once.

    Raises:
        ValueError: no address, or one given twice.
    """

    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise ValueError("replicas: no address given; expected at least one server")
        seen: set[str] = set()
        for address in addresses:
            if address in seen:
                raise ValueError(f"replicas: {address} is given twice; expected each server once")
            seen.add(address)
        self.addresses = tuple(addresses)
        self.errors: dict[int, RemoteError] = {}
        """The lost replicas, each with the error that lost it."""
        self._home: dict[Hashable, int] = {}  # a running episode's replica
        self._running = [0] * len(self.addresses)  # running episodes per replica
        self._history: dict[Hashable, list[Any]] = {}  # a running episode's requests
        self._moved: set[Hashable] = set()  # episodes whose replica was lost
        self._turn = 0  # the next replica of a row outside any episode

    def __repr__(self) -> str:
        return f"ReplicaSet({list(self.addresses)!r}, lost={sorted(self.errors)})"

    @property
    def several(self) -> bool:
        """Whether there is more than one replica (only then is a loss survived)."""
        return len(self.addresses) > 1

    def live(self) -> list[int]:
        """The replicas not lost, in order."""
        return [replica for replica in range(len(self.addresses)) if replica not in self.errors]

    def ask(
        self,
        episodes: Sequence[Hashable | None],
        send: Send,
        keep: Callable[[int], Any] | None = None,
    ) -> list[Any]:
        """Every row's answer, row ``i`` belonging to episode ``episodes[i]`` (None: to none).

        The rows go to their episodes' replicas (``send``); the rows of a replica that was
        lost go again, to live replicas, after their episodes' earlier requests (``replays``).
        ``keep(row)`` is what row ``row``'s request is kept as, to be replayed; it is called
        only while there are several replicas, once the row is answered.

        Raises:
            ReplicaLostError: the one replica is lost (with one address).
            RemoteError: every replica is lost (with several), naming each and its error.
            Exception: what a replica raised that is no loss (the first, in replica order).
        """
        rows = len(episodes)
        if not self.several:
            outcome = send({0: list(range(rows))}, {})[0]
            if isinstance(outcome, BaseException):
                raise outcome
            return list(outcome)
        answers: list[Any] = [None] * rows
        pending = list(range(rows))
        # Each pass answers every row or loses a replica, so at most one pass per replica.
        while pending:
            self._check_left()
            groups = self._route(episodes, pending)
            replays = {
                row: list(self._history.get(episodes[row], ()))
                for row in pending
                if episodes[row] in self._moved
            }
            outcomes = send(groups, replays)
            pending, failure = [], None
            for replica, group in groups.items():
                outcome = outcomes[replica]
                if isinstance(outcome, ReplicaLostError):
                    self._mark(replica, outcome)
                    pending.extend(group)
                elif isinstance(outcome, BaseException):
                    failure = failure or outcome
                else:
                    self._answered(episodes, group, list(outcome), answers, keep)
            if failure is not None:
                raise failure
            pending.sort()
        return answers

    def each(self, step: Callable[[int], Any]) -> dict[int, Any]:
        """``step(replica)`` for every live replica, in order, by replica; a replica whose step
        raised ``ReplicaLostError`` is lost (with one address, the error is raised).

        Raises:
            RemoteError: every replica is lost, naming each and its error.
        """
        done = {}
        for replica in self.live():
            try:
                done[replica] = step(replica)
            except ReplicaLostError as error:
                self.lose(replica, error)
        self._check_left()
        return done

    def lose(self, replica: int, error: RemoteError) -> None:
        """Mark ``replica`` lost by ``error``, found outside ``ask`` (its running episodes
        move at their next request).

        Raises:
            RemoteError: ``error`` itself with one address; with several, when no replica is
                left, the error naming each.
        """
        if not self.several:
            raise error
        self._mark(replica, error)
        self._check_left()

    def end(self, episode: Hashable) -> int | None:
        """Episode ``episode`` ended: what was kept of it goes. The replica to tell (0 with
        one address), or None when its replica was lost or it never reached one."""
        self._history.pop(episode, None)
        self._moved.discard(episode)
        if not self.several:
            return 0
        replica = self._home.pop(episode, None)
        if replica is not None:
            self._running[replica] -= 1
        return replica

    def reset(self) -> None:
        """Every replica alive again, no episode running (the model was closed)."""
        self.errors.clear()
        self._home.clear()
        self._running = [0] * len(self.addresses)
        self._history.clear()
        self._moved.clear()
        self._turn = 0

    # ------------------------------------------------------------------ the bookkeeping

    def _route(self, episodes: Sequence[Hashable | None], rows: list[int]) -> Groups:
        live = self.live()
        groups: Groups = {}
        for row in rows:
            episode = episodes[row]
            if episode is None:
                replica = live[self._turn % len(live)]
                self._turn += 1
            else:
                replica = self._home.get(episode)
                if replica is None:
                    replica = min(live, key=lambda each: (self._running[each], each))
                    self._home[episode] = replica
                    self._running[replica] += 1
            groups.setdefault(replica, []).append(row)
        return dict(sorted(groups.items()))

    def _answered(
        self,
        episodes: Sequence[Hashable | None],
        group: list[int],
        outcome: list[Any],
        answers: list[Any],
        keep: Callable[[int], Any] | None,
    ) -> None:
        if len(outcome) != len(group):
            raise RuntimeError(
                f"a replica's part answered {len(outcome)} rows of {len(group)}: a client "
                f"must answer every row it was given"
            )
        for row, answer in zip(group, outcome, strict=True):
            answers[row] = answer
            episode = episodes[row]
            if episode is None:
                continue
            self._moved.discard(episode)
            if keep is not None:
                self._history.setdefault(episode, []).append(keep(row))

    def _mark(self, replica: int, error: RemoteError) -> None:
        self.errors[replica] = error
        for episode, home in list(self._home.items()):
            if home == replica:
                del self._home[episode]
                self._moved.add(episode)
        self._running[replica] = 0

    def _check_left(self) -> None:
        if len(self.errors) < len(self.addresses):
            return
        lost = "; ".join(
            f"{self.addresses[replica]}: {error}" for replica, error in sorted(self.errors.items())
        )
        last = self.errors[max(self.errors)]
        raise RemoteError(
            f"every replica of the served model is lost ({len(self.addresses)} given): {lost}",
            address=", ".join(self.addresses),
            code=last.code,
        )


def replica_addresses(address: str, replicas: Sequence[str] | None) -> list[str]:
    """``[address, *replicas]``, checked: ``replicas`` is a list of address strings.

    Example:
        >>> replica_addresses("openpi://a:1", ["openpi://b:2"])
        ['openpi://a:1', 'openpi://b:2']

    Raises:
        TypeError: ``replicas`` is a string, or holds something that is not one.
    """
    if replicas is None:
        return [address]
    if isinstance(replicas, (str, bytes)) or not isinstance(replicas, Sequence):
        raise TypeError(
            f"replicas must be a list of addresses (the other servers of the model), got "
            f"{replicas!r}"
        )
    for each in replicas:
        if not isinstance(each, str):
            raise TypeError(f"replicas: {each!r} is not an address string")
    return [address, *replicas]


def take_rows(batch: Any, rows: list[int]) -> Any:
    """Rows ``rows`` of a batch (leaf by leaf; a dict nests), as a batch of their own: arrays
    copied, a text leaf (a list of strings) as a new list. A client sends a replica its part
    of a batched payload so, and keeps a row so for a replay.

    Example:
        >>> take_rows({"state": np.arange(6).reshape(3, 2), "prompt": ["a", "b", "c"]}, [2, 0])
        {'state': array([[4, 5],
               [0, 1]]), 'prompt': ['c', 'a']}
    """

    def take(leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray):
            return leaf[rows]
        return [leaf[row] for row in rows]

    return map_leaves(batch, take)


def joined_rows(answers: list[tuple[Any, int]]) -> Any:
    """One batch, rows in order, from each row's answer ``(its part, its position in it)``:
    the parts are the batches the replicas answered. The one part itself when every row is
    in it in order; else the parts' leaves joined and put in row order.

    Example:
        >>> a, b = np.array([10, 11]), np.array([20])  # replica 0 had rows 0 and 2
        >>> joined_rows([(a, 0), (b, 0), (a, 1)])
        array([10, 20, 11])
    """
    parts: dict[int, Any] = {}
    for part, _ in answers:
        parts.setdefault(id(part), part)
    if len(parts) == 1 and all(position == row for row, (_, position) in enumerate(answers)):
        return answers[0][0]
    offsets, start = {}, 0
    for key, part in parts.items():
        offsets[key] = start
        start += _batch_rows(part)
    order = np.array([offsets[id(part)] + position for part, position in answers])
    ordered = list(parts.values())
    return map_leaves(
        ordered[0],
        lambda *leaves: np.concatenate([np.asarray(leaf) for leaf in leaves])[order],
        *ordered[1:],
    )


def _batch_rows(batch: Any) -> int:
    while isinstance(batch, dict):
        batch = next(iter(batch.values()))
    return len(batch)


__all__ = [
    "Groups",
    "ReplicaLostError",
    "ReplicaSet",
    "Send",
    "joined_rows",
    "replica_addresses",
    "take_rows",
]
