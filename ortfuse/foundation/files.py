"""Files ortfuse writes and reads back (docs/ARCHITECTURE.md §7): written atomically and private
(readers see the old content or the new one, never a partial write; mode 0600 whatever the umask);
models handed to ORT as a path, and read as bytes without a copy; read-modify-writes of shared
files under one lock helper (``locked``); content digests computed once per file state
(``content_digest``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks; writes stay atomic
    fcntl = None  # type: ignore[assignment]

FILE_MODE = 0o600


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` (str: UTF-8) to a unique temporary file beside ``path`` (mode 0600), then
    ``os.replace`` it into place. The temporary file is removed if anything fails; the folder must exist."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with open(fd, "wb") as f:
            os.fchmod(fd, FILE_MODE)  # the umask may have taken the owner's bits; nobody else gets any
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path: str | os.PathLike, shared: bool = False) -> Iterator[None]:
    """Hold an advisory lock (``flock``) on ``<path>.lock`` (created 0600) while the block runs:
    exclusive for a read-modify-write of ``path`` or a build of it, ``shared`` for readers that must
    not see it removed. The one lock helper of ortfuse's shared cache files; without ``fcntl`` (not
    POSIX) a no-op. The lock file's folder must exist."""
    if fcntl is None:
        yield
        return
    fd = os.open(f"{os.fspath(path)}.lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def model_file(source: str | bytes):
    """A file path ORT can load ``source`` from: the path itself, or the bytes written to a temporary
    file (removed after). ORT parses a model handed over as bytes while holding the GIL, for tens
    of milliseconds on a few-MB model, which served runs of this process would wait for; it reads a
    path with the GIL released (``tools/swap_gil_probe.py`` measures both)."""
    if isinstance(source, str):
        yield source
        return
    with tempfile.TemporaryDirectory(prefix="ortfuse-swap-") as folder:
        path = os.path.join(folder, "plan.onnx")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE), "wb") as fh:
            fh.write(source)
        yield path


@contextlib.contextmanager
def model_bytes(source: str | bytes):
    """The serialized model as a buffer (bytes, or a read-only mmap of the file), or None when the
    file cannot be read or mapped."""
    if isinstance(source, bytes):
        yield source
        return
    try:
        fh = open(source, "rb")  # noqa: SIM115 - closed below, after the map
    except OSError:
        yield None
        return
    try:
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield data
    except (OSError, ValueError):  # empty or unmappable: the parsed path reports it
        yield None
    finally:
        fh.close()


# ------------------------------------------------------------------ content digests

RACY_S = 2.0  # a file state younger than this is never remembered (see content_digest)
KEEP_DIGESTS = 1024  # digests remembered on disk, newest kept
_digests: dict[tuple, tuple[str, Any]] = {}


def file_state(path: str | os.PathLike) -> tuple[int, ...] | None:
    """What names one state of a file: device, inode, size, mtime and ctime (ns); None when absent."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class Digest(NamedTuple):
    sha256: str  # of the file's bytes
    scanned: Any  # what ``scan`` found in them (None without ``scan``)
    state: tuple[int, ...] | None  # the state hashed (file_state); None: the file changed meanwhile


def content_digest(path: str | os.PathLike, scan: Callable[[Any], Any] | None = None) -> Digest | None:
    """The sha256 of the file's bytes (and ``scan(bytes)``, a JSON value), or None when it cannot be
    read. Computed once per file state (``file_state``) and remembered in this process and in
    ``<cache>/digests/``, so a fresh process reads one small file instead of the model. Any write
    changes a file's ctime (the kernel sets it; ``os.utime`` cannot set it back), so a state names
    one content; a state younger than ``RACY_S`` is not remembered, since a write within the same
    clock tick as the hashing could leave it unchanged (git's "racily clean" rule)."""
    state = file_state(path)
    if state is None:
        return None
    memo_key = (*state, scan.__qualname__ if scan is not None else "")
    known = _digests.get(memo_key)
    if known is not None:
        return Digest(*known, state)
    memo = _memo_path(memo_key)
    if memo is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            data = json.loads(memo.read_text())
            found = (data["sha256"], data["scanned"])
            _digests[memo_key] = found
            return Digest(*found, state)
    with model_bytes(os.fspath(path)) as data:
        if data is None:
            if state[2] != 0:
                return None
            data = b""  # an empty file cannot be mapped
        found = (hashlib.sha256(data).hexdigest(), scan(data) if scan is not None else None)
    if file_state(path) != state:  # written while hashed: right for no state, remembered for none
        return Digest(*found, None)
    if time.time_ns() - max(state[3], state[4]) >= RACY_S * 1e9:
        _digests[memo_key] = found
        if memo is not None:
            with contextlib.suppress(OSError):
                write_atomic(memo, json.dumps({"sha256": found[0], "scanned": found[1]}))
                keep_newest(memo.parent, KEEP_DIGESTS)
    return Digest(*found, state)


def _memo_path(memo_key: tuple) -> Path | None:
    from ortfuse.foundation.cache_paths import DIGESTS, cache_dir

    try:
        return cache_dir(DIGESTS) / hashlib.sha256(repr(memo_key).encode()).hexdigest()[:32]
    except OSError:
        return None


def keep_newest(folder: Path, keep: int) -> None:
    """Remove all but the ``keep`` newest files of ``folder`` (another process may remove one first)."""
    names = os.listdir(folder)
    if len(names) <= keep:
        return
    stats = []
    for name in names:
        with contextlib.suppress(OSError):
            stats.append((os.stat(folder / name).st_mtime_ns, name))
    for _, name in sorted(stats, reverse=True)[keep:]:
        with contextlib.suppress(OSError):
            os.unlink(folder / name)
