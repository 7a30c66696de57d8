"""``ensure_registered(op_defs)``: compile native ops (or load them from numba's cache) and add their
records to onnxruntime-extensions with ``AddExternalCustomOp``, once per process. It must run before
``SessionOptions.register_custom_ops_library`` for the ops to exist in that session (extensions
reads its op list then); ``registration.register_native`` does both (docs/ARCHITECTURE.md §6)."""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
from collections.abc import Iterable

from ortfuse.custom_ops.native.availability import add_external_custom_op, unavailable_reason
from ortfuse.custom_ops.native.callbacks import shared_callbacks
from ortfuse.custom_ops.native.lifetime import compile_cfunc, immortal
from ortfuse.custom_ops.native.op_def import NativeOpDef
from ortfuse.custom_ops.native.records import OpRecord
from ortfuse.custom_ops.native.slots import POOL
from ortfuse.custom_ops.native.threads import init_settings
from ortfuse.custom_ops.numba_setup import configure_numba
from ortfuse.custom_ops.ort_api import SIG_KERNEL_COMPUTE_V2, SIG_WORKER

log = logging.getLogger("ortfuse.native")

_lock = threading.RLock()
_registered: dict[str, OpRecord] = immortal({})


def _python_op_names() -> set[str]:
    """Op types defined as onnxruntime-extensions Python ops (``onnx_op``) in this process (none
    when its Python package was never imported: that is where they are defined)."""
    ocos = sys.modules.get("onnxruntime_extensions._ocos")
    Opdef = getattr(ocos, "Opdef", None)  # noqa: N806 - the extensions class
    if Opdef is None:
        return set()
    return {getattr(op, "op_type", "") for op in list(getattr(Opdef, "_odlist", {}).values())}


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
