"""The writer's lock of a results file: one writer at a time, readers never wait.

``ResultsFile.open`` takes it before it touches the file and holds it until ``close``; a
second writer gets a ``ResultsFileLockedError`` that names the holder (pid, host, since).

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "r.jsonl")
    >>> lock = WriterLock.acquire(path)
    >>> os.path.exists(path + LOCK_SUFFIX)
    True
    >>> WriterLock.acquire(path)
    Traceback (most recent call last):
    ...
    rlmesh.errors.ResultsFileLockedError: ... is being written by another run (pid ...
    >>> lock.release()
    >>> os.path.exists(path + LOCK_SUFFIX)
    False
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import IO, Any

from ..errors import ResultsFileLockedError

try:
    import fcntl
except ImportError:  # Windows: the lock file is created exclusively instead (see WriterLock)
    fcntl = None  # type: ignore[assignment]

LOCK_SUFFIX = ".lock"  # the writer's lock file sits next to the results file


class WriterLock:
    """The exclusive right to write one results file, held for a whole run.

    The lock is ``fcntl.flock`` on a lock file next to the results file (``PATH.lock``), which
    holds its owner's pid, host and start time, so a second writer can say who holds it. The
    operating system drops a flock when its process ends however it ends, so a lock file left
    behind by a killed run is simply taken over. Readers take no lock. Without ``fcntl``
    (Windows) the lock file is created exclusively instead; one left by a killed run must then
    be deleted by hand, and the error says so.
    """

    def __init__(self, lock_path: str, fd: int) -> None:
        self.lock_path = lock_path
        # A file object owns the descriptor, so a lock its owner forgot to release is still
        # dropped when the object is collected (the flock goes with the descriptor).
        self._file: IO[bytes] | None = os.fdopen(fd, "r+b", buffering=0)

    @classmethod
    def acquire(cls, results_path: str) -> WriterLock:
        """The lock of ``results_path``, or a ``ResultsFileLockedError`` naming its holder."""
        lock_path = results_path + LOCK_SUFFIX
        if fcntl is None:
            return cls._acquire_exclusive(results_path, lock_path)
        while True:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise _locked_error(results_path, holder, stale_hint=False) from None
            # The previous holder removes the lock file before releasing it: a lock taken on
            # the removed file guards nothing, so take it again on the file at the path.
            if _same_file(fd, lock_path):
                break
            os.close(fd)
        _write_holder(fd)
        return cls(lock_path, fd)

    @classmethod
    def _acquire_exclusive(cls, results_path: str, lock_path: str) -> WriterLock:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            with open(lock_path, "rb") as handle:
                holder = _parse_holder(handle.read())
            raise _locked_error(results_path, holder, stale_hint=True) from None
        _write_holder(fd)
        return cls(lock_path, fd)

    def release(self) -> None:
        """Remove the lock file and drop the lock; a second call does nothing."""
        if self._file is None:
            return
        file, self._file = self._file, None
        try:
            if _same_file(file.fileno(), self.lock_path):
                os.unlink(self.lock_path)
        finally:
            file.close()


def _same_file(fd: int, path: str) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _write_holder(fd: int) -> None:
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(holder).encode())


def _read_holder(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    return _parse_holder(os.read(fd, 4096))


def _parse_holder(data: bytes) -> dict[str, Any]:
    try:
        holder = json.loads(data)
    except ValueError:  # the holder is between taking the lock and writing its name
        return {}
    return holder if isinstance(holder, dict) else {}


def _locked_error(path: str, holder: dict[str, Any], *, stale_hint: bool) -> ResultsFileLockedError:
    if holder:
        who = (
            f"pid {holder.get('pid')} on {holder.get('host')}, running since {holder.get('since')}"
        )
    else:
        who = "a process that has not recorded its pid yet"
    hint = f"; if no such run is alive, delete {path}{LOCK_SUFFIX}" if stale_hint else ""
    return ResultsFileLockedError(
        f"{path} is being written by another run ({who}): wait for it to end or choose another "
        f"path (reading it, e.g. rlmesh report, works meanwhile){hint}",
        path=path,
        holder=holder,
    )
