"""The ahead-of-time ops library at run time (no numba, no llvmlite): where it lives, building it,
checking it, loading it and handing its records to the native runtime (docs/ARCHITECTURE.md §6b).

One library per ISA level, CPU and versions: ``<cache>/ops/libortfuse_ops-<level>-<key>.so``, where
the key digests the CPU fingerprint, the level, ortfuse's ``custom_ops`` sources and the versions of
ortfuse, onnxruntime, numba and llvmlite. A changed kernel or upgrade gives a new key, so a stale library
is never loaded. ``ORTFUSE_OPS_LIBRARY``: ``off`` never uses a library (the in-process numba path
runs); a path uses that file.

Only what ortfuse built is loaded (a library runs code as it is loaded, so every check comes
before): the file must be this user's alone (owned by them, or by root for a configured path, and
writable by nobody else) and name in its bytes an ortfuse library of this version
(``key=...;isa=...;version=...``, ``ortfuse_aot_info``); the cache's library must also match the
record its build left beside it (``<library>.json``: key and sha256 of the file) and carry this
machine's key. A cache library that fails is built again (``library_path``) or, in a session,
left for in-process kernels with a warning (``loaded``); a configured one that names another
version is refused with the reason. A refused cache folder (``cache_paths``) holds no library.

``library_path(build_missing=True)`` builds a missing library in a child process (``aot.build``:
numba compiles every native op for the level, a C toolchain links them), one build at a time per
file (``foundation.files.locked``), and returns its path; ``loaded()`` returns the library already on
disk, loaded once per process, or None (it never builds: the native runtime then compiles in-process
as before, says so once, and ``build_in_background`` starts the build for the next processes).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import logging
import mmap
import os
import re
import subprocess
import threading
import time
from pathlib import Path

from ortfuse.foundation.child_process import python_argv

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
    from ortfuse.foundation.source_digest import tree_digest

    return tree_digest([_PACKAGE_DIR])


def level() -> str:
    """The ISA level the library is built for: the one the in-process path compiles for (the host's,
    or numba's ``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES`` target), so kernel labels are the same."""
    from ortfuse.foundation import isa

    return isa.target_level(*isa.numba_target())


def key(isa_level: str | None = None) -> str:
    """The library's key on this machine: CPU fingerprint, level, sources and versions."""
    from ortfuse.foundation import isa
    from ortfuse.foundation.versions import installed

    versions = installed(("ortfuse", "onnxruntime", "numba", "llvmlite"))
    text = json.dumps([isa.fingerprint(), isa_level or level(), source_digest(), versions], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def version() -> str:
    """What a library built on any machine must carry to be loaded by this ortfuse: the sources and
    versions of ``key`` without the CPU and level (``ortfuse ops-library --out`` builds for others)."""
    from ortfuse.foundation.versions import installed

    versions = installed(("ortfuse", "onnxruntime", "numba", "llvmlite"))
    return hashlib.sha256(json.dumps([source_digest(), versions], sort_keys=True).encode()).hexdigest()[:20]


_INFO = re.compile(rb"key=([0-9a-f]{20});isa=([A-Za-z0-9_]+);version=([0-9a-f]{20});")


def _info(data) -> re.Match | None:
    """The ``key=...;isa=...;version=...;`` string of a library's bytes (``ortfuse_aot_info``), or None."""
    pos = data.find(b"key=")
    while pos >= 0:
        found = _INFO.match(bytes(data[pos:pos + 96]))
        if found is not None:
            return found
        pos = data.find(b"key=", pos + 1)
    return None


def _record(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def refusal(path: Path, configured: bool) -> str:
    """Why the library file ``path`` must not be loaded ("" when it may), decided before it is opened
    (see the module docstring); ``configured``: named by ``ORTFUSE_OPS_LIBRARY``."""
    from ortfuse.foundation.cache_paths import not_owned
    from ortfuse.foundation.files import content_digest

    try:
        st = os.stat(path)
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            found = _info(data)
    except (OSError, ValueError) as exc:
        return f"it cannot be read ({exc})"
    owner = not_owned(st)
    if owner and not (configured and st.st_uid == 0 and not owner.startswith("writable")):
        return f"it is {owner}"
    if found is None or found.group(3).decode() != version():
        return "it is not an ortfuse ops library of this version"
    if configured:
        return ""
    try:
        record = json.loads(_record(path).read_text())
        if not_owned(os.stat(_record(path))):
            raise ValueError("record not ours")
        built = (record["key"], record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return "no record of its build lies beside it"
    digest = content_digest(path)
    if built[0] != key(found.group(2).decode()) or found.group(1).decode() != built[0] or \
            digest is None or digest.sha256 != built[1]:
        return "it is not the file ortfuse built there"
    return ""


def default_path(isa_level: str | None = None) -> Path:
    from ortfuse.foundation.cache_paths import OPS, cache_dir

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
        self.version = info.get("version", "")
        count = range(self.cdll.ortfuse_aot_count())
        self.ops = {self.cdll.ortfuse_aot_name(i).decode(): int(self.cdll.ortfuse_aot_op(i)) for i in count}
        self.node_attrs = {self.cdll.ortfuse_aot_name(i).decode(): self.cdll.ortfuse_aot_node_attrs(i).decode()
                           for i in count}
        self.omitted = frozenset(n for n in info.get("omitted", "").split(",") if n)

    def use_pool(self, pool_address: int) -> None:
        self.cdll.ortfuse_aot_use_pool(pool_address)


def build(path: Path | None = None, isa_level: str | None = None, jobs: int | None = None) -> dict:
    """Build the library at ``path`` (default: this machine's) in a child process, and record its
    key and digest beside it (``<library>.json``); returns the build's summary. Raises LibraryError
    with the reason when it fails."""
    import tempfile

    from ortfuse.foundation.files import FILE_MODE, content_digest, write_atomic
    from ortfuse.foundation.isa import numba_env

    lv = isa_level or level()
    path = Path(os.path.abspath(path if path is not None else default_path(lv)))  # the child runs elsewhere
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ortfuse-aot-numba-") as numba_cache:
        env = {**os.environ, **numba_env(lv), "NUMBA_CACHE_DIR": numba_cache}
        cmd = [*python_argv(), "-m", "ortfuse.custom_ops.aot.build", "--isa", lv, "--key", key(lv),
               "--version", version(), "--out", str(path)]
        if jobs:
            cmd += ["--jobs", str(jobs)]
        try:  # started in a private folder: nothing of the caller's working directory is imported
            done = subprocess.run(cmd, env=env, cwd=numba_cache, capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LibraryError(f"building the ortfuse ops library failed: {exc}") from exc
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise LibraryError(f"building the ortfuse ops library failed: {last[0]}")
    try:
        os.chmod(path, FILE_MODE)
        digest = content_digest(path)
        if digest is None:
            raise OSError("the built library cannot be read")
        write_atomic(_record(path), json.dumps({"key": key(lv), "version": version(), "sha256": digest.sha256}))
    except OSError as exc:
        raise LibraryError(f"recording the built ortfuse ops library failed: {exc}") from exc
    return json.loads(done.stdout.strip().splitlines()[-1])


def library_path(build_missing: bool = True, isa_level: str | None = None) -> Path:
    """Path of this machine's ops library, built first when missing or refused (``build_missing``);
    LibraryError when it is disabled, missing, refused (a configured file) or cannot be built.
    ``isa_level``: the cache's library of that level instead (built and checked the same way; neither
    ``ORTFUSE_OPS_LIBRARY`` nor its ``off`` applies: ``ortfuse export`` ships it, no session loads it)."""
    from ortfuse.foundation.files import locked

    if isa_level is None and disabled():
        raise LibraryError(f"the ops library is disabled by {ENV}")
    path = _configured_path() if isa_level is None else default_path(isa_level)
    if isa_level is None and os.environ.get(ENV, "").strip():
        if not path.is_file():
            raise LibraryError(f"{ENV} names {path}, which does not exist")
        why = refusal(path, configured=True)
        if why:
            raise LibraryError(_configured_refusal(path, why))
        return path
    if not build_missing:
        if not path.is_file() or refusal(path, configured=False):
            raise LibraryError(f"no ops library at {path}")
        return path
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _lock, locked(path):
        # another process may have built it while this one waited; a refused file is built again
        if not path.is_file() or refusal(path, configured=False):
            t0 = time.perf_counter()
            summary = build(path, isa_level)
            log.info("ortfuse: built the ops library %s (%d ops, %.0f s)", path, len(summary["ops"]),
                     time.perf_counter() - t0)
    return path


def _configured_refusal(path: Path, why: str) -> str:
    return (f"{ENV} names {path}, which is refused: {why} (build one with `ortfuse ops-library --out {path}`, "
            f"or unset {ENV})")


def build_in_background() -> bool:
    """Start building this machine's library in a detached child process at the lowest CPU priority
    (``python -m ortfuse ops-library``), so that later processes load it; this process keeps
    compiling in-process. Not when a library path is configured, the library is disabled or the
    cache folder was refused. True when a build was started."""
    from ortfuse.foundation.cache_paths import in_scratch

    if os.environ.get(ENV, "").strip() or _state.get("background") or in_scratch(default_path()):
        return False
    _state["background"] = True
    try:  # its own session (no terminal's signals), started in "/" (nothing there to import)
        child = subprocess.Popen([*python_argv(), "-m", "ortfuse", "ops-library"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                 cwd=os.path.abspath(os.sep))
    except OSError as exc:
        log.info("ortfuse: could not start building the ops library: %s", exc)
        return False
    with contextlib.suppress(AttributeError, OSError):  # ended already, or no priorities here: it builds at ours
        os.setpriority(os.PRIO_PROCESS, child.pid, 19)
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
                        configured = bool(os.environ.get(ENV, "").strip())
                        why = refusal(path, configured)
                        if why:
                            log.warning("ortfuse: %s; compiling kernels in-process",
                                        _configured_refusal(path, why) if configured else
                                        f"not loading the ops library {path}: {why} (it is built again "
                                        "for later processes)")
                            build_in_background()
                            return None
                        lib = OpsLibrary(path)
                        if lib.isa != level():  # numba targets another level here: labels must stay true
                            log.info("ortfuse: the ops library %s is built for %s, this process compiles "
                                     "for %s; compiling kernels in-process", path, lib.isa, level())
                            return None
                        if lib.version != version() or (not configured and lib.key != key()):
                            log.warning("ortfuse: the ops library %s names another build (key %s); compiling "
                                        "kernels in-process", path, lib.key)
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
