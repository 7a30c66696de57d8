"""The ahead-of-time ops library at run time (no numba, no llvmlite): where it lives, building it,
loading it and handing its records to the native runtime (docs/ARCHITECTURE.md §6b).

One library per ISA level, CPU and versions: ``<cache>/ops/libortfuse_ops-<level>-<key>.so``, where
the key digests the CPU fingerprint, the level, ortfuse's ``custom_ops`` sources and the versions of
ortfuse, onnxruntime, numba and llvmlite. A changed kernel or upgrade gives a new key, so a stale library
is never loaded. ``ORTFUSE_OPS_LIBRARY``: ``off`` never uses a library (the in-process numba path
runs); a path uses that file.

``library_path(build_missing=True)`` builds a missing library in a child process (``aot.build``:
numba compiles every native op for the level, a C toolchain links them), one build at a time per
file (a lock file), and returns its path; ``loaded()`` returns the library already on disk, loaded
once per process, or None (it never builds: the native runtime then compiles in-process as before,
says so once, and ``build_in_background`` starts the build for the next processes).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger("ortfuse.native")

ENV = "ORTFUSE_OPS_LIBRARY"
BUILD_TIMEOUT_S = 900
_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # ortfuse.custom_ops
_lock = threading.RLock()
_state: dict = {}


class LibraryError(RuntimeError):
    """The ops library cannot be built or loaded here (the message says why and what to do)."""


def disabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("0", "off", "false", "no")


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """A digest of every ``.py`` file of ``ortfuse.custom_ops`` (what the library is compiled from)."""
    from ortfuse.runtime.source_digest import tree_digest

    return tree_digest([_PACKAGE_DIR])


def level() -> str:
    """The ISA level the library is built for: the one the in-process path compiles for (the host's,
    or numba's ``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` target), so kernel labels are the same."""
    from ortfuse.kernels import isa

    return isa.target_level(*isa.numba_target())


def key(isa_level: str | None = None) -> str:
    from ortfuse.kernels import isa
    from ortfuse.runtime.versions import installed

    versions = installed(("ortfuse", "onnxruntime", "numba", "llvmlite"))
    text = json.dumps([isa.fingerprint(), isa_level or level(), source_digest(), versions], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def default_path(isa_level: str | None = None) -> Path:
    from ortfuse.runtime.cache_paths import OPS, cache_dir

    lv = isa_level or level()
    return cache_dir(OPS) / f"libortfuse_ops-{lv}-{key(lv)}.so"


def _configured_path() -> Path:
    env = os.environ.get(ENV, "").strip()
    return Path(env).expanduser() if env and not disabled() else default_path()


class OpsLibrary:
    """A loaded ops library: ``ops`` maps op type -> address of its ``OrtCustomOp`` record,
    ``node_attrs`` op type -> where its ``node_attrs`` function lives, ``omitted`` the op types a
    higher ISA level's library holds and this one leaves out (``NativeOpDef.min_level``)."""

    def __init__(self, path: Path):
        self.path = path
        self.cdll = ctypes.CDLL(str(path))
        for name, res, args in (("ortfuse_aot_count", ctypes.c_int64, []),
                                ("ortfuse_aot_name", ctypes.c_char_p, [ctypes.c_int64]),
                                ("ortfuse_aot_op", ctypes.c_void_p, [ctypes.c_int64]),
                                ("ortfuse_aot_info", ctypes.c_char_p, []),
                                ("ortfuse_aot_node_attrs", ctypes.c_char_p, [ctypes.c_int64]),
                                ("ortfuse_aot_use_pool", None, [ctypes.c_int64])):
            fn = getattr(self.cdll, name)
            fn.restype, fn.argtypes = res, args
        info = dict(part.split("=", 1) for part in self.cdll.ortfuse_aot_info().decode().split(";"))
        self.isa = info.get("isa", "")
        self.key = info.get("key", "")
        count = range(self.cdll.ortfuse_aot_count())
        self.ops = {self.cdll.ortfuse_aot_name(i).decode(): int(self.cdll.ortfuse_aot_op(i)) for i in count}
        self.node_attrs = {self.cdll.ortfuse_aot_name(i).decode(): self.cdll.ortfuse_aot_node_attrs(i).decode()
                           for i in count}
        self.omitted = frozenset(n for n in info.get("omitted", "").split(",") if n)

    def use_pool(self, pool_address: int) -> None:
        self.cdll.ortfuse_aot_use_pool(pool_address)


def build(path: Path | None = None, isa_level: str | None = None, jobs: int | None = None) -> dict:
    """Build the library at ``path`` (default: this machine's) in a child process; returns the
    build's summary. Raises LibraryError with the reason when it fails."""
    from ortfuse.kernels.isa import numba_env

    lv = isa_level or level()
    path = Path(path) if path is not None else default_path(lv)
    path.parent.mkdir(parents=True, exist_ok=True)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ortfuse-aot-numba-") as numba_cache:
        env = {**os.environ, **numba_env(lv), "NUMBA_CACHE_DIR": numba_cache}
        cmd = [sys.executable, "-m", "ortfuse.custom_ops.aot.build", "--isa", lv, "--key", key(lv),
               "--out", str(path)]
        if jobs:
            cmd += ["--jobs", str(jobs)]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LibraryError(f"building the ortfuse ops library failed: {exc}") from exc
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise LibraryError(f"building the ortfuse ops library failed: {last[0]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _lock_file(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(str(path) + ".lock", "w")  # noqa: SIM115 - held until the build ends
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def library_path(build_missing: bool = True) -> Path:
    """Path of this machine's ops library, built first when missing (``build_missing``); LibraryError
    when it is disabled, missing or cannot be built."""
    if disabled():
        raise LibraryError(f"the ops library is disabled by {ENV}")
    path = _configured_path()
    if path.is_file() or not build_missing:
        if not path.is_file():
            raise LibraryError(f"no ops library at {path}")
        return path
    if os.environ.get(ENV, "").strip():
        raise LibraryError(f"{ENV} names {path}, which does not exist")
    with _lock, _lock_file(path):
        if not path.is_file():  # another process may have built it while this one waited
            t0 = time.perf_counter()
            summary = build(path)
            log.info("ortfuse: built the ops library %s (%d ops, %.0f s)", path, len(summary["ops"]),
                     time.perf_counter() - t0)
    return path


def build_in_background() -> bool:
    """Start building this machine's library in a detached child process at the lowest CPU priority
    (``python -m ortfuse ops-library``), so that later processes load it; this process keeps
    compiling in-process. Not when a library path is configured or the library is disabled. True
    when a build was started."""
    if os.environ.get(ENV, "").strip() or _state.get("background"):
        return False
    _state["background"] = True
    try:
        subprocess.Popen([sys.executable, "-m", "ortfuse", "ops-library"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         preexec_fn=lambda: os.nice(19))  # noqa: PLW1509 - only nice() runs in the child
    except OSError as exc:
        log.info("ortfuse: could not start building the ops library: %s", exc)
        return False
    return True


def loaded() -> OpsLibrary | None:
    """This machine's ops library, loaded once per process and pointed at the process's pool block;
    None when it is disabled or not built (nothing is built here)."""
    with _lock:
        if "library" not in _state:
            _state["library"] = None
            if not disabled():
                try:
                    path = _configured_path()
                    if path.is_file():
                        lib = OpsLibrary(path)
                        if lib.isa != level():  # numba targets another level here: labels must stay true
                            log.info("ortfuse: the ops library %s is built for %s, this process compiles "
                                     "for %s; compiling kernels in-process", path, lib.isa, level())
                            return None
                        from ortfuse.custom_ops.native.pool import POOL

                        lib.use_pool(ctypes.addressof(POOL))
                        _state["library"] = lib
                except (OSError, ValueError, AttributeError) as exc:
                    log.warning("ortfuse: cannot load the ops library (%s); compiling kernels in-process", exc)
        return _state["library"]


def forget() -> None:
    """Look for the library again on the next ``loaded()`` (after a build)."""
    with _lock:
        _state.pop("library", None)
