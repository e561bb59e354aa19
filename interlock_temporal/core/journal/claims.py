"""Exclusive claims on effects, released the instant their holder dies. No time-to-live.

On one host, the kernel holds the lock and drops it when the process dies, SIGKILL included;
an in-process table keeps a process from racing itself. On Linux every claim is a one-byte
open-file-description lock in one shared file, at an offset derived from the effect id: a claim
and its release are one system call each, with no file created or removed (creating and
unlinking a file per effect waits on the file system's journal, which the journal's own
flushes keep busy). Elsewhere, ``flock`` on one lock file per claimed effect. Classic
``fcntl`` record locks would do neither: they drop when *any* descriptor of the file closes.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import struct
import threading
import weakref
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

    def held(self) -> int:
        """How many claims this process holds now."""
        ...

    def close(self) -> None:
        """Give up every claim this process holds."""
        ...


def host_claims(directory: Path) -> Claims:
    """The claims of workers sharing this host, kept in ``directory``: range locks where the
    kernel has them (Linux), else a lock file per claimed effect. Every worker of one host
    must run a release that picks the same kind."""
    if RangeClaims.available():
        return RangeClaims(directory)
    return FileClaims(directory)


def _check_id(effect_id: str) -> None:
    if not effect_id.isalnum():
        raise ValueError("effect ids are hex strings")


#: whatever holds claims' descriptors, closed in a child this process forks: both kinds of lock
#: belong to an open file description, which a forked child shares, so a child that outlived
#: its parent would keep the parent's claims alive. From the fork until the child has run this
#: (or, for a subprocess, until its exec closes the close-on-exec descriptors) the child shares
#: them: a parent killed inside that window frees its claims a moment after it dies, not at once
_OPEN: weakref.WeakSet[FileClaims | RangeClaims] = weakref.WeakSet()


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
        #: effect id -> the descriptor holding its lock (None while it is being taken)
        self._held: dict[str, int | None] = {}
        self._lock = threading.Lock()
        _OPEN.add(self)

    def _path(self, effect_id: str) -> Path:
        _check_id(effect_id)
        return self.directory / f"{effect_id}.lock"

    def _release_local(self, effect_id: str) -> None:
        with self._lock:
            self._held.pop(effect_id, None)

    def try_claim(self, effect_id: str) -> _FileClaim | None:
        path = self._path(effect_id)
        with self._lock:
            if effect_id in self._held:
                return None
            self._held[effect_id] = None
        try:
            fd = self._lock_file(path)
        except BaseException:
            self._release_local(effect_id)
            raise
        if fd is None:
            self._release_local(effect_id)
            return None
        with self._lock:
            self._held[effect_id] = fd
        return _FileClaim(self, effect_id, path, fd)

    def _lock_file(self, path: Path) -> int | None:
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
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

    def held(self) -> int:
        return len(self._held)

    def close(self) -> None:
        """Each claim holds its own descriptor: release them one by one."""
        _OPEN.discard(self)

    def _forget_in_child(self) -> None:
        for fd in self._held.values():
            if fd is not None:
                os.close(fd)
        self._held.clear()
        self._lock = threading.Lock()


#: ``struct flock`` on 64-bit Linux: type, whence, start, length, pid (0 for these locks)
_FLOCK = struct.Struct("hhqqi4x")
_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)
_OFD_GETLK: int | None = getattr(fcntl, "F_OFD_GETLK", None)


class _RangeClaim:
    __slots__ = ("_offset", "_owner", "effect_id")

    def __init__(self, owner: RangeClaims, effect_id: str, offset: int) -> None:
        self._owner: RangeClaims | None = owner
        self.effect_id = effect_id
        self._offset = offset

    def release(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            owner._unlock(self._offset)

    def __enter__(self) -> _RangeClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class RangeClaims:
    """Claims for workers sharing one host (Linux): a one-byte lock per claimed effect in one
    file, ``ranges.lock`` in ``directory``, held through this process's one descriptor of it."""

    FILE = "ranges.lock"

    @staticmethod
    def available() -> bool:
        return _OFD_SETLK is not None and _OFD_GETLK is not None and struct.calcsize("P") == 8

    def __init__(self, directory: Path) -> None:
        if not self.available():
            raise OSError(errno.ENOSYS, "open file description locks are not available here")
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / self.FILE
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._held: set[int] = set()
        self._lock = threading.Lock()
        _OPEN.add(self)

    @staticmethod
    def _offset(effect_id: str) -> int:
        """60 bits of the id's hash: distinct effects never share a byte in practice, and if
        two ever did, they would only wait for each other."""
        _check_id(effect_id)
        return int.from_bytes(hashlib.sha256(effect_id.encode()).digest()[:8], "big") >> 4

    def _fcntl(self, command: int | None, kind: int, offset: int) -> bytes:
        assert command is not None
        return fcntl.fcntl(self._fd, command, _FLOCK.pack(kind, os.SEEK_SET, offset, 1, 0))

    def try_claim(self, effect_id: str) -> _RangeClaim | None:
        offset = self._offset(effect_id)
        with self._lock:
            if offset in self._held:
                return None
            self._held.add(offset)
        try:
            self._fcntl(_OFD_SETLK, fcntl.F_WRLCK, offset)
        except BaseException as err:
            with self._lock:
                self._held.discard(offset)
            if isinstance(err, OSError) and err.errno in (errno.EAGAIN, errno.EACCES):
                return None
            raise
        return _RangeClaim(self, effect_id, offset)

    def _unlock(self, offset: int) -> None:
        try:
            if self._fd >= 0:
                self._fcntl(_OFD_SETLK, fcntl.F_UNLCK, offset)
        finally:
            with self._lock:
                self._held.discard(offset)

    def is_claimed(self, effect_id: str) -> bool:
        """Whether a live process holds the claim right now (asks the kernel; takes nothing)."""
        offset = self._offset(effect_id)
        with self._lock:
            if offset in self._held:
                return True
        found = self._fcntl(_OFD_GETLK, fcntl.F_WRLCK, offset)
        kind: int = _FLOCK.unpack(found)[0]
        return kind != fcntl.F_UNLCK

    def held(self) -> int:
        return len(self._held)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
        _OPEN.discard(self)

    def _forget_in_child(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
        self._held.clear()
        self._lock = threading.Lock()


def _after_fork_in_child() -> None:
    for claims in list(_OPEN):
        claims._forget_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
