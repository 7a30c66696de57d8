"""Adding native ops' records to onnxruntime-extensions with ``AddExternalCustomOp``, once per process
and op: ``ensure_from_library(names)`` takes them from the ahead-of-time ops library (no numba),
``ensure_registered(op_defs)`` compiles them in-process with numba (or loads numba's cache). Either
must run before ``SessionOptions.register_custom_ops_library`` for the ops to exist in that session
(extensions reads its op list then); ``registration.register_native`` does both (docs/ARCHITECTURE.md
§6, §6b)."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections.abc import Iterable

from ortfuse.custom_ops.native.availability import add_external_custom_op, unavailable_reason
from ortfuse.custom_ops.native.lifetime import immortal
from ortfuse.custom_ops.native.op_def import NativeOpDef
from ortfuse.custom_ops.native.pool import DEFAULT_PARALLEL_MIN, POOL, set_threading

log = logging.getLogger("ortfuse.native")

_lock = threading.RLock()
_registered: dict = immortal({})  # op type -> its OpRecord (JIT) or the OpsLibrary holding its record


def _python_op_names() -> set[str]:
    """Op types defined as onnxruntime-extensions Python ops (``onnx_op``) in this process (none
    when its Python package was never imported: that is where they are defined)."""
    ocos = sys.modules.get("onnxruntime_extensions._ocos")
    Opdef = getattr(ocos, "Opdef", None)  # noqa: N806 - the extensions class
    if Opdef is None:
        return set()
    return {getattr(op, "op_type", "") for op in list(getattr(Opdef, "_odlist", {}).values())}


def init_settings() -> None:
    """The threading settings of $ORTFUSE_THREADING and $ORTFUSE_PARALLEL_MIN (else "ort" and
    ``DEFAULT_PARALLEL_MIN``), set when the first native op is registered. The numba mode imports
    numba (``threads.set_threading``); the others do not."""
    env_mode = os.environ.get("ORTFUSE_THREADING", "ort").strip().lower() or "ort"
    env_min = os.environ.get("ORTFUSE_PARALLEL_MIN", "").strip()
    try:
        par_min = int(env_min) if env_min else DEFAULT_PARALLEL_MIN
        if env_mode == "numba":
            from ortfuse.custom_ops.native.threads import set_threading as set_numba_threading

            set_numba_threading(env_mode, par_min)
        else:
            set_threading(env_mode, par_min)
    except (ValueError, RuntimeError) as exc:
        log.warning("ortfuse: %s; using ORT's thread pool", exc)
        set_threading("ort", DEFAULT_PARALLEL_MIN)


def ensure_from_library(names: Iterable[str]) -> bool:
    """Add the records of ``names`` from the ops library (``aot.library.loaded``), once per process;
    True when every one of them is registered afterwards, False (adding nothing) when the library is
    not there, lacks one of them or the native path is unavailable."""
    from ortfuse.custom_ops.aot.library import loaded

    names = list(dict.fromkeys(names))
    if unavailable_reason():
        return False
    with _lock:
        todo = [n for n in names if n not in _registered]
        if not todo:
            return True
        library = loaded()
        if library is None or any(n not in library.ops for n in todo):
            return False
        if set(todo) & _python_op_names():
            return False
        if not _registered:
            init_settings()
        add_external = add_external_custom_op()
        for n in todo:
            if not add_external(library.ops[n]):
                return False
            _registered[n] = library
    return True


def ensure_registered(op_defs: Iterable[NativeOpDef]) -> tuple[bool, str]:
    """Compile (or load from the cache) and add the native ops ``op_defs`` to onnxruntime-extensions,
    once per process (an op whose name is already added is skipped).

    Returns (True, "") or (False, reason); on False nothing new was added.
    """
    defs = {d.name: d for d in op_defs}
    reason = unavailable_reason()
    if reason:
        return False, reason
    with _lock:
        todo = [n for n in defs if n not in _registered]
        if not todo:
            return True, ""
        clash = sorted(set(todo) & _python_op_names())
        if clash:  # the same name on both paths makes extensions' RegisterCustomOps loop forever
            return False, f"a Python op is already named {', '.join(clash)}"
        from ortfuse.custom_ops.native.callbacks import shared_callbacks
        from ortfuse.custom_ops.native.lifetime import compile_cfunc
        from ortfuse.custom_ops.native.records import OpRecord
        from ortfuse.custom_ops.numba_setup import configure_numba
        from ortfuse.custom_ops.ort_api import SIG_KERNEL_COMPUTE_V2, SIG_WORKER

        try:
            configure_numba()
            if not _registered:
                init_settings()
            callbacks = shared_callbacks()
            built = {n: (compile_cfunc(defs[n].compute, SIG_KERNEL_COMPUTE_V2),
                         compile_cfunc(defs[n].worker, SIG_WORKER) if defs[n].worker else None) for n in todo}
        except Exception as exc:  # noqa: BLE001 - numba/LLVM failure: the caller falls back to the reference path
            log.warning("ortfuse: compiling native kernels failed: %s", exc)
            return False, f"compiling native kernels failed: {type(exc).__name__}: {exc}"
        add_external = add_external_custom_op()
        for n in todo:
            compute, worker = built[n]
            record = OpRecord(defs[n], len(_registered) + 1, ctypes.addressof(POOL), callbacks, compute, worker)
            if not add_external(record.address):
                return False, f"AddExternalCustomOp refused {n}"
            _registered[n] = record
    return True, ""


def registered_ops() -> list[str]:
    """Native op types added to onnxruntime-extensions in this process."""
    with _lock:
        return list(_registered)
