"""numba's set-up for this package, done by an explicit call (``configure_numba()``), never on import
(importing this module does not import numba).

Code that compiles the package's kernels calls it first: registering native ops
(``native.install.ensure_registered``, ``registration.native_op_table``), the numba threading mode,
tools that run the kernels directly. It does two things (docs/ARCHITECTURE.md §6, §7):

* on-disk cache: functions defined in this package are cached under ``cache_root()``
  (``$NUMBA_CACHE_DIR``, else the ``numba`` folder of ortfuse's cache root, never beside the sources, which may be
  read-only in site-packages) and stamped with ``package_source_stamp()``, a digest of every file of
  the package that contains numba code, so an edit of a kernel in one file recompiles the cfuncs in
  other files that call it. Functions outside the package keep numba's usual cache locations.
  numba picks a function's cache location when the function is decorated, so the call also moves
  the cache of the package's functions decorated before it (modules imported earlier): the order of
  imports does not matter.
* threading layer: OpenMP (``omp``) when the user chose none, numba's threads have not started and
  OpenMP is importable (the ``workqueue`` layer aborts on concurrent use, §6).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import threading

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
PACKAGE = __name__.rpartition(".")[0]  # ortfuse.custom_ops

_lock = threading.Lock()
_state: dict = {}  # "locator": bool once configured


def cache_root() -> str:
    """Where compiled kernels of this package are cached: ``$NUMBA_CACHE_DIR`` if set, else the
    ``numba`` folder of ortfuse's cache root (``ortfuse.foundation.cache_paths``). Never beside the
    sources; never a folder another user owns or can write (numba's cache holds pickles and code):
    such a one is refused as ``cache_paths`` refuses a cache folder, for a private temporary one."""
    from pathlib import Path

    from ortfuse.foundation.cache_paths import NUMBA, cache_dir, private

    if os.environ.get("NUMBA_CACHE_DIR"):
        return str(private(Path(os.environ["NUMBA_CACHE_DIR"]), NUMBA, fix="point NUMBA_CACHE_DIR at a folder "
                           "only you can write"))
    return str(cache_dir(NUMBA))


def _package_sources() -> list[str]:
    found = []
    for root, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found.extend(os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))
    return found


@functools.lru_cache(maxsize=8)
def _digest(stats: tuple) -> str:
    import numba

    h = hashlib.sha256(numba.__version__.encode())
    for path, _mtime, _size in stats:
        with open(path, "rb") as f:
            data = f.read()
        if b"numba" in data:  # only files that can hold compiled code count
            h.update(os.path.relpath(path, PACKAGE_DIR).encode())
            h.update(data)
    return h.hexdigest()


def package_source_stamp() -> str:
    """A digest of the ``.py`` files of this package that mention numba (and numba's version).

    numba's own stamp covers only the file that defines a function, so a cached cfunc would keep
    stale code after an edit of a kernel it calls in another file; this stamp changes with any of
    them. Files without numba code (specs, references, registration) do not invalidate the cache.
    """
    stats = []
    for path in _package_sources():
        st = os.stat(path)
        stats.append((path, st.st_mtime_ns, st.st_size))
    return _digest(tuple(stats))


def _in_package(path: str) -> bool:
    return path.startswith(PACKAGE_DIR + os.sep)


def _make_locator_class(base):
    class OrtfuseCacheLocator(base):
        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = os.path.join(cache_root(), self.get_suitable_cache_subpath(py_file))

        def get_cache_path(self):
            return self._cache_path

        def get_source_stamp(self):
            return package_source_stamp()

        def get_disambiguator(self):
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func, py_file):
            path = os.path.abspath(py_file)
            if not _in_package(path) or not os.path.exists(path):
                return None
            self = cls(py_func, path)
            try:
                self.ensure_cache_path()
            except OSError:
                return None
            return self

    return OrtfuseCacheLocator


def _install_cache_locator() -> bool:
    """Route numba's on-disk cache of this package's functions to ``cache_root()``, stamped with
    ``package_source_stamp()``. Returns False when numba's internals differ (then
    ``NUMBA_CACHE_DIR`` is pointed at ``cache_root()`` if unset)."""
    import numba

    try:
        from numba.core import caching
        base, impl = caching._CacheLocator, caching.CacheImpl
        impl._locator_classes  # noqa: B018 - probe the attribute
    except (ImportError, AttributeError):
        if not os.environ.get("NUMBA_CACHE_DIR"):
            os.environ["NUMBA_CACHE_DIR"] = cache_root()
            numba.config.CACHE_DIR = cache_root()
        return False
    if not any(getattr(c, "__name__", "") == "OrtfuseCacheLocator" for c in impl._locator_classes):
        impl._locator_classes.insert(0, _make_locator_class(base))
    return True


def _relocate_earlier_caches() -> None:
    """Give the package's cached functions decorated before the locator existed (their cache location
    was chosen then) a new cache under ``cache_root()``; compiled code already loaded stays."""
    from numba.core.caching import FunctionCache
    from numba.core.dispatcher import Dispatcher

    for name, module in list(sys.modules.items()):
        if module is None or not (name == PACKAGE or name.startswith(PACKAGE + ".")):
            continue
        for obj in list(vars(module).values()):
            if not isinstance(obj, Dispatcher) or not isinstance(obj._cache, FunctionCache):
                continue
            locator = getattr(obj._cache._impl, "locator", None)
            if type(locator).__name__ != "OrtfuseCacheLocator" and _in_package(
                    os.path.abspath(obj.py_func.__code__.co_filename)):
                obj.enable_caching()


def _configure_threading_layer() -> None:
    """Prefer numba's OpenMP layer: parallel kernels run from ORT's threads and from several Python
    threads at once, which the ``workqueue`` layer does not survive. Left alone when the user chose
    a layer, when numba's threads already started, or when OpenMP is missing."""
    if os.environ.get("NUMBA_THREADING_LAYER"):
        return
    import numba

    try:
        from numba.np.ufunc import parallel
        if parallel._is_initialized:
            return
        from numba.np.ufunc import omppool  # noqa: F401 - is the OpenMP layer importable?
    except ImportError:
        return
    numba.config.THREADING_LAYER = "omp"


def configure_numba() -> bool:
    """Set numba up for this package's kernels (cache locator, threading layer); idempotent and
    cheap after the first call. Returns whether the package's cache locator is in place (False:
    numba's internals differ, and ``NUMBA_CACHE_DIR`` was pointed at ``cache_root()`` instead)."""
    with _lock:
        if "locator" not in _state:
            _configure_threading_layer()
            _state["locator"] = _install_cache_locator()
            if _state["locator"]:
                _relocate_earlier_caches()
            launch_thread_pool()
        return _state["locator"]


def launch_thread_pool() -> None:
    """Start numba's thread pool (after the threading layer is chosen). numba starts it when it
    compiles or loads a parallel function itself, but a cached *caller* of one (a public kernel of
    ``kernels/eltwise.py``, a cfunc calling it) may not record that it needs the pool: loaded from
    the cache, it would call the pool's NULL entry point (a segfault; numba does not serialise the
    reload hooks of a cached library). ``get_num_threads()`` starts the pool (public API)."""
    import numba

    numba.get_num_threads()
