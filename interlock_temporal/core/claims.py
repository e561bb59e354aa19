"""Exclusive claims on effects, released the instant their holder dies. No time-to-live.

On one host: ``flock`` on a lock file held open for the claim (``fcntl`` record locks would drop
when *any* descriptor of the file closes), plus an in-process lock because a process must not
race itself. The kernel drops the ``flock`` when the process dies, SIGKILL included.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from pathlib import Path
from typing import Protocol


class Claim(Protocol):
    effect_id: str

    def release(self) -> None: ...


class Claims(Protocol):
    def try_claim(self, effect_id: str) -> Claim | None:
        """The claim, or None if a live holder (this process or another) has it."""
        ...

    def is_claimed(self, effect_id: str) -> bool: ...


class _FileClaim:
    __slots__ = ("_fd", "_owner", "_path", "effect_id")

    def __init__(self, owner: FileClaims, effect_id: str, path: Path, fd: int) -> None:
        self._owner = owner
        self.effect_id = effect_id
        self._path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            # unlink while still holding the lock: a waiter that opened this inode re-checks it
            self._path.unlink(missing_ok=True)
        finally:
            os.close(fd)
            self._owner._release_local(self.effect_id)

    def __enter__(self) -> _FileClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class FileClaims:
    """Claims for workers sharing one host: one lock file per claimed effect, removed on release."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._held: set[str] = set()
        self._lock = threading.Lock()

    def _path(self, effect_id: str) -> Path:
        if not effect_id.isalnum():
            raise ValueError("effect ids are hex strings")
        return self.directory / f"{effect_id}.lock"

    def _release_local(self, effect_id: str) -> None:
        with self._lock:
            self._held.discard(effect_id)

    def try_claim(self, effect_id: str) -> _FileClaim | None:
        path = self._path(effect_id)
        with self._lock:
            if effect_id in self._held:
                return None
            self._held.add(effect_id)
        try:
            fd = self._lock_file(path)
        except BaseException:
            self._release_local(effect_id)
            raise
        if fd is None:
            self._release_local(effect_id)
            return None
        return _FileClaim(self, effect_id, path, fd)

    def _lock_file(self, path: Path) -> int | None:
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    return None
                raise
            # the holder we waited on may have unlinked this inode; the live file is the claim
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def is_claimed(self, effect_id: str) -> bool:
        """Whether a live process holds the claim right now (probes without keeping it)."""
        claim = self.try_claim(effect_id)
        if claim is None:
            return True
        claim.release()
        return False
