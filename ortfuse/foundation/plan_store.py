"""A plan store shared by replicas (docs/ARCHITECTURE.md §7): published plan files by key, and a
lease that lets one replica at a time make the plan of a key (leaf: standard library only).

``Store`` is the interface an object store can implement too: ``get(key)`` -> the published bytes or
None; ``put_atomic(key, data)``: a reader sees the old bytes or the new ones, never a part;
``lease(key, ttl_s)`` -> a ``Lease`` when no live one is held by another, else None;
``Lease.renew()`` extends it by its ttl (False when it was lost); ``Lease.release()``. The bytes are
not trusted: the reader checks them (``runtime.plan_artifact`` checks a plan file's digest first).

``DirectoryStore``: a folder on a shared filesystem. ``<key>.plan`` is published by writing a unique
temporary file beside it and ``os.replace``; ``<key>.lease`` holds JSON ``{owner, pid, host,
expires}`` (wall-clock seconds: replicas on several hosts share no monotonic clock). A lease is
taken by creating the file with ``O_EXCL``; an expired one (its holder died or stalled past its ttl)
is taken over by renaming it aside first (one rename wins; a taker that finds it moved another's
fresh lease puts it back) and creating it again.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import re
import socket
import time
import uuid
from pathlib import Path

from ortfuse.foundation.files import write_atomic

_KEY = re.compile(r"[0-9A-Za-z_-]{1,128}")


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise ValueError(f"a plan store key is 1-128 letters, digits, '-' or '_', got {key!r}")
    return key


class Lease(abc.ABC):
    """The right to make the plan of ``key`` until ``expires`` (time.time()), unless renewed."""

    key: str
    expires: float

    @abc.abstractmethod
    def renew(self) -> bool:
        """Extend the lease by its ttl; False when it is no longer this holder's (expired and taken)."""

    @abc.abstractmethod
    def release(self) -> None:
        """Give the lease up (a no-op when it was lost)."""


class Store(abc.ABC):
    """Where replicas find and publish plan files by key."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes | None:
        """The bytes published under ``key``, or None."""

    @abc.abstractmethod
    def put_atomic(self, key: str, data: bytes) -> None:
        """Publish ``data`` under ``key``: readers see the previous bytes or these, never a part."""

    @abc.abstractmethod
    def lease(self, key: str, ttl_s: float) -> Lease | None:
        """The lease of ``key`` for ``ttl_s`` seconds, or None while another holder's is live."""


class DirectoryLease(Lease):
    def __init__(self, path: Path, key: str, owner: str, ttl_s: float, expires: float) -> None:
        self.path, self.key, self.owner, self.ttl_s, self.expires = path, key, owner, ttl_s, expires

    def _mine(self) -> bool:
        return _read_lease(self.path).get("owner") == self.owner

    def renew(self) -> bool:
        if not self._mine():
            return False
        self.expires = time.time() + self.ttl_s
        write_atomic(self.path, json.dumps(_record(self.owner, self.expires)))
        return self._mine()

    def release(self) -> None:
        if self._mine():
            with contextlib.suppress(OSError):
                self.path.unlink()


def _record(owner: str, expires: float) -> dict:
    return {"owner": owner, "pid": os.getpid(), "host": socket.gethostname(), "expires": expires}


def _read_lease(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


class DirectoryStore(Store):
    """A store in ``folder`` (created when missing), shared by the replicas that can write it."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def get(self, key: str) -> bytes | None:
        try:
            return (self.folder / f"{check_key(key)}.plan").read_bytes()
        except OSError:
            return None

    def put_atomic(self, key: str, data: bytes) -> None:
        write_atomic(self.folder / f"{check_key(key)}.plan", data)

    def lease(self, key: str, ttl_s: float) -> DirectoryLease | None:
        path = self.folder / f"{check_key(key)}.lease"
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        for _ in range(2):
            expires = time.time() + ttl_s
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                held = _read_lease(path)
                if held and float(held.get("expires", 0)) > time.time():
                    return None  # a live holder
                if not held and _younger_than(path, 5.0):
                    return None  # being written by its taker right now
                aside = path.with_name(f".{path.name}.{uuid.uuid4().hex}.expired")
                try:
                    os.rename(path, aside)  # one taker wins; the others find the new lease or none
                except OSError:
                    continue
                moved = _read_lease(aside)
                if moved.get("owner") != held.get("owner"):  # another taker's new lease, moved after it won
                    with contextlib.suppress(OSError):
                        os.link(aside, path)  # put back unless a lease is there again
                    with contextlib.suppress(OSError):
                        os.unlink(aside)
                    return None
                with contextlib.suppress(OSError):
                    os.unlink(aside)
                continue
            with open(fd, "w") as f:
                f.write(json.dumps(_record(owner, expires)))
            return DirectoryLease(path, key, owner, ttl_s, expires)
        return None


def _younger_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return False
