"""Where ortfuse keeps what it generates (zoo models, tuning decisions, fused plans, compiled
kernels, source and file digests): ``$ORTFUSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ortfuse``, else
``~/.cache/ortfuse`` (docs/ARCHITECTURE.md §7). No heavy imports: a session that only reads its plan
cache imports no onnx.

The cache is private: ``cache_dir`` creates the root and each folder under it with mode 0700, and
tightens a folder of its own to 0700. A root or folder owned by another user or writable by group or
others (a shared ``ORTFUSE_CACHE_DIR``, a world-writable ``XDG_CACHE_HOME``) is refused: a warning
once, in one sentence, and this process uses a private temporary folder instead (removed at exit),
so nothing another user wrote is read (no plan, no decision, no library, no numba cache) and
nothing of this process is left where others can read it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import threading
import warnings
from pathlib import Path

ENV = "ORTFUSE_CACHE_DIR"
XDG_ENV = "XDG_CACHE_HOME"

# the sub-folder of each cache user
MODELS, PLANS, TUNING, NUMBA, OPS, SOURCES, DIGESTS = "models", "plans", "tuning", "numba", "ops", "sources", "digests"

_lock = threading.Lock()
_scratch: list[Path] = []  # this process's private stand-in for a refused cache
_warned: set[str] = set()


def configured_root() -> Path:
    """The cache root the environment names (read on every call), checked by nothing."""
    env = os.environ.get(ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get(XDG_ENV)
    # the XDG spec ignores a relative XDG_CACHE_HOME
    base = Path(xdg).expanduser() if xdg and os.path.isabs(os.path.expanduser(xdg)) else Path.home() / ".cache"
    return base / "ortfuse"


def cache_dir(sub: str = "") -> Path:
    """The cache root (``sub``: one user's folder under it), created private; a private temporary
    folder instead when the root or that folder is not this user's alone (see the module docstring)."""
    root = configured_root()
    base = private(root, "")
    if not sub:
        return base
    return private(root / sub, sub, tighten=True) if base == root else scratch_dir(sub)


def private(folder: Path, sub: str, tighten: bool = False, fix: str = f"point {ENV} at a folder only you can write"
            ) -> Path:
    """``folder`` when it is this user's alone (``not_private``), else (warned once) this process's
    private temporary folder ``sub``."""
    why = not_private(folder, tighten)
    if not why:
        return folder
    _warn_once(str(folder), f"ortfuse: the cache folder {folder} is {why}, so ortfuse neither reads nor "
               f"writes it and runs without that cache ({fix})")
    return scratch_dir(sub)


def not_private(folder: Path, tighten: bool = True) -> str:
    """Why ``folder`` may not hold ortfuse's cache ("" when it may): it is created with mode 0700
    when missing; one of this user's is tightened to 0700 (``tighten``). A folder that cannot be
    created is not refused: nothing can be read from or written to it."""
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        try:
            os.makedirs(folder.parent, exist_ok=True)
            os.mkdir(folder, 0o700)
            os.chmod(folder, 0o700)  # the umask may have taken bits of 0700
            st = os.stat(folder)
        except OSError:
            return ""
    except OSError:
        return ""
    return not_owned(st) or _tightened(folder, st, tighten)


def not_owned(st: os.stat_result) -> str:
    """Why a file or folder with this ``stat`` is not this user's alone ("" when it is)."""
    if st.st_uid != os.geteuid():
        return f"owned by another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "writable by other users"
    return ""


def _tightened(folder: Path, st: os.stat_result, tighten: bool) -> str:
    if tighten and stat.S_ISDIR(st.st_mode) and st.st_mode & 0o077:
        try:
            os.chmod(folder, 0o700)
        except OSError:
            return "readable by other users and cannot be made private"
    return ""


def scratch_dir(sub: str = "") -> Path:
    """This process's private temporary cache (mode 0700, removed at exit)."""
    with _lock:
        if not _scratch:
            _scratch.append(Path(tempfile.mkdtemp(prefix="ortfuse-private-cache-")))
            atexit.register(shutil.rmtree, _scratch[0], True)
        folder = _scratch[0] / sub if sub else _scratch[0]
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def in_scratch(path: Path) -> bool:
    """Whether ``path`` lies in this process's stand-in for a refused cache."""
    return bool(_scratch) and _scratch[0] in Path(path).parents


def _warn_once(what: str, message: str) -> None:
    with _lock:
        if what in _warned:
            return
        _warned.add(what)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
