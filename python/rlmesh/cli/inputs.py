"""What the user names on the command line, checked and read before anything runs: an env id
(``check_env``), an env id or factory (``load_env``), a seeds file (``read_seeds``), a tags
file (``read_tags``) and a served policy's address (``served_policy``, with the spec a built-in
suite ships for it: ``ready_made_spec``), or the comma-separated addresses of several replicas
of one served model (``openpi://a:8000,openpi://b:8000``: ``replicas``). Each refuses bad
input with a one-line ``UsageError``.

Example:
    >>> check_env("CartPole-v1")  # a registered id: nothing to say
    >>> check_env("NoSuchEnv-v0")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rlmesh.policies.UsageError: --env 'NoSuchEnv-v0': ...; expected a registered Gymnasium id ...
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import gymnasium as gym

from ..adapters import checked_env_tags
from ..policies import load_object
from ..remote.address import is_address, is_openpi_address, is_vlaeval_address
from .exits import UsageError


def read_seeds(path: str) -> list[int]:
    """The seeds in ``path``: non-negative integers separated by whitespace or commas."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--seeds {path}: cannot read it ({exc.strerror})") from None
    seeds = []
    for number, line in enumerate(text.splitlines(), start=1):
        for token in line.replace(",", " ").split():
            if not token.isdigit():
                raise UsageError(
                    f"--seeds {path}, line {number}: {token!r} is not a non-negative integer; "
                    "expected integer seeds separated by whitespace, commas or newlines"
                )
            seeds.append(int(token))
    if not seeds:
        raise UsageError(f"--seeds {path} holds no seeds; expected at least one integer")
    return seeds


def check_env(env_id: str) -> None:
    """Refuse an env id Gymnasium does not know, before anything runs.

    ``module:Id`` imports ``module`` first (as ``gymnasium.make`` does), for envs registered on
    import.
    """
    module, _, name = env_id.rpartition(":")
    expected = (
        "expected a registered Gymnasium id such as CartPole-v1 (or module:Id for an env its "
        "module registers)"
    )
    try:
        if module:
            importlib.import_module(module)
    except Exception as exc:
        raise UsageError(
            f"--env {env_id!r}: importing {module} failed: {type(exc).__name__}: "
            f"{str(exc).rstrip('.')}; {expected}"
        ) from None
    try:
        gym.spec(name)
    except Exception as exc:
        raise UsageError(f"--env {env_id!r}: {str(exc).rstrip('.')}; {expected}") from None


def load_env(spec: str) -> Any:
    """What ``rlmesh serve env`` serves: an env factory (``module:fn`` or ``file.py:fn``) or
    a Gymnasium id (``CartPole-v1``, ``module:Id``), told apart by whether ``fn`` exists."""
    target, _, name = spec.rpartition(":")
    factory = target.endswith(".py")
    if target and not factory:
        try:
            factory = hasattr(importlib.import_module(target), name)
        except Exception:  # check_env says what is wrong with the module
            factory = False
    if not factory:
        check_env(spec)
        return spec
    made = load_object(
        spec, "env", "expected a Gymnasium id, package.module:make_env or file.py:make_env"
    )
    if not callable(made):
        raise UsageError(
            f"env {spec!r}: {name} is a {type(made).__name__}; expected a zero-argument "
            f"function returning a gymnasium.Env"
        )
    return made


def read_tags(path: str) -> Any:
    """The ``EnvTags`` in the adapters-v1 JSON file ``--tags path``; a UsageError if it cannot
    be read, a SpecError naming the file if it is not valid tags."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"--tags {path!r}: {exc.strerror}") from None
    return checked_env_tags(f"--tags {path}", text)


def is_served(policy: str) -> bool:
    """Whether ``POLICY`` names a served model (an address, or the comma-separated addresses
    of its replicas) rather than code to load."""
    first = policy.split(",", 1)[0].strip()
    return is_address(first) or is_openpi_address(first) or is_vlaeval_address(first)


def replicas(policy: str) -> list[str]:
    """The addresses in ``POLICY``: one, or several replicas of one served model separated by
    commas, each speaking the first one's protocol.

    Example:
        >>> replicas("openpi://a:8000, openpi://b:8000")
        ['openpi://a:8000', 'openpi://b:8000']
        >>> replicas("openpi://a:8000,b:8000")
        Traceback (most recent call last):
        ...
        rlmesh.policies.UsageError: policy 'openpi://a:8000,b:8000': replica 'b:8000' does ...
    """
    addresses = [each.strip() for each in policy.split(",")]
    if not all(addresses):
        raise UsageError(
            f"policy {policy!r}: an empty address; expected addresses separated by single commas"
        )
    speaks = _protocol(addresses[0])
    for address in addresses[1:]:
        if _protocol(address) != speaks:
            raise UsageError(
                f"policy {policy!r}: replica {address!r} does not speak {speaks[1]} as "
                f"{addresses[0]!r} does; give every replica as {speaks[2]}"
            )
    return addresses


def _protocol(address: str) -> tuple[str, str, str]:
    """The protocol ``address`` speaks: its key, its name in errors, its address form."""
    if is_openpi_address(address):
        return "openpi", "openpi's protocol", "openpi://host:port"
    if is_vlaeval_address(address):
        return "vlaeval", "vla-eval's protocol", "vlaeval://host:port"
    if is_address(address):
        return "rlmesh", "rlmesh-wire-v1", "tcp://host:port, host:port or unix:///path"
    return "none", "any protocol", "an address"


def ready_made_spec(suite: str | None, policy: str) -> Any:
    """The model spec built-in suite ``suite`` ships for a policy served over the protocol
    that address ``policy`` speaks (openpi's LIBERO input, say), else None (also when
    ``suite`` is a file)."""
    from .. import benchmarks

    facts = benchmarks.SUITES.get(suite) if suite is not None else None
    if facts is None or os.path.exists(suite):
        return None
    first = policy.split(",", 1)[0].strip()  # replicas share one protocol
    # served_specs are keyed by the protocol's own name.
    protocol = {"openpi": "openpi", "vlaeval": "vla-eval"}.get(_protocol(first)[0])
    factory = facts.served_specs.get(protocol) if protocol else None
    return None if factory is None else factory()


def served_policy(address: str, token: str | None, spec: Any = None) -> Any:
    """``rlmesh.RemoteModel(address)`` (needs the remote extra), or for ``openpi://host:port``
    ``rlmesh.remote.OpenPIModel(address, api_key=token, spec=spec)`` and for
    ``vlaeval://host:port`` ``rlmesh.remote.VlaEvalModel(address, api_key=token, spec=spec)``
    (both need the openpi extra). Comma-separated addresses are replicas of one model: the
    first is ``address``, the others go to ``replicas=``, all with the one ``token``."""
    from ..remote import require_grpc, require_openpi, require_vlaeval

    policy = address
    address, *others = replicas(policy)
    more = others or None

    if is_vlaeval_address(address):  # vla-eval's protocol: --policy-token as a Bearer token
        try:
            require_vlaeval("remote.VlaEvalModel")
        except ImportError as exc:
            raise UsageError(f"policy {policy!r} is a vla-eval model server: {exc}") from None
        from ..remote.vlaeval.client import VlaEvalModel

        try:
            return VlaEvalModel(address, api_key=token, spec=spec, replicas=more)
        except ValueError as exc:
            raise UsageError(f"policy {policy!r}: {exc}") from None

    if is_openpi_address(address):
        try:
            require_openpi("remote.OpenPIModel")
        except ImportError as exc:
            raise UsageError(f"policy {policy!r} is an openpi policy server: {exc}") from None
        from ..remote.openpi.client import OpenPIModel

        try:
            return OpenPIModel(address, api_key=token, spec=spec, replicas=more)
        except ValueError as exc:
            raise UsageError(f"policy {policy!r}: {exc}") from None

    try:
        require_grpc("RemoteModel")
    except ImportError as exc:
        raise UsageError(f"policy {policy!r} is a served model: {exc}") from None
    from ..remote.model_client import RemoteModel

    try:
        return RemoteModel(address, token=token, replicas=more)
    except ValueError as exc:
        raise UsageError(f"policy {policy!r}: {exc}") from None
