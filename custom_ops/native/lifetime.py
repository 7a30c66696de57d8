"""What ORT may point at lives until the process exits: ``immortal`` keeps an object alive through
interpreter shutdown, and ``compile_cfunc`` compiles a function to a cfunc once per process and
keeps the cfunc (its machine code is what ORT calls)."""

from __future__ import annotations

import ctypes
import threading


def immortal(obj):
    """Keep ``obj`` alive through interpreter shutdown, when module globals are cleared but ORT may
    still destroy sessions and so call KernelDestroy on our records, pool and code."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    return obj


COMPILED: dict = immortal({})  # python function -> its cfunc (compute callbacks, workers, shared callbacks)
KEEP: list = immortal([])      # other compiled objects ORT points into (the LLVM library of the IR stubs)
_lock = threading.RLock()


def compile_cfunc(fn, sig):
    """The cfunc of ``fn`` with signature ``sig``, compiled (or loaded from numba's cache) on first use."""
    with _lock:
        compiled = COMPILED.get(fn)
        if compiled is None:
            from numba import cfunc  # here: importing this module (the pool, the library path) needs no numba

            compiled = cfunc(sig, cache=True)(fn)
            COMPILED[fn] = compiled
        return compiled
