"""Kernel registry: which kernels can run a fused op, and which one this CPU gets.

A kernel is (op, path, ISAs, dtypes, priority). Paths:
- ``native``: numba cfuncs registered as ORT custom ops (no GIL, no copies); op type = the spec name.
  numba compiles them for one ISA per process (DESIGN.md §4b): the level whose ``isa.numba_env``
  this process was started with, else the host's best level (numba's default target is the host).
- ``reference``: the numpy reference through onnxruntime-extensions' Python-op path; op type
  ``<name>Ref``; any ISA, float32; always available, lowest priority.
``select`` returns the highest-priority kernel whose ISA this CPU supports and whose dtype matches,
or the reason there is none (the rewriter then leaves the match unfused with that reason).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from ortfuse import isa as _isa
from ortfuse.custom_ops.specs import SPECS

NATIVE, REFERENCE = "native", "reference"
REFERENCE_LABEL = "reference (numpy through onnxruntime-extensions Python op)"
ANY = "any"


@dataclass(frozen=True)
class Kernel:
    op: str
    path: str
    isas: tuple[str, ...]
    dtypes: tuple[str, ...]
    priority: int

    @property
    def op_type(self) -> str:
        return self.op if self.path == NATIVE else SPECS[self.op].ref_op_type


@dataclass(frozen=True)
class Selection:
    kernel: Kernel | None
    isa: str = ""
    reason: str = ""

    @property
    def label(self) -> str:
        if self.kernel is None:
            return ""
        if self.kernel.path == REFERENCE:
            return REFERENCE_LABEL
        return f"native numba {self.isa}"


def native_isa() -> str:
    """The ISA level numba compiles for in this process: the level whose ``numba_env`` the
    environment carries, else the host's best level."""
    for level in _isa.ISA_LEVELS:
        try:
            env = _isa.numba_env(level)
        except ValueError:
            continue
        if all(os.environ.get(k) == v for k, v in env.items()):
            return level
    return _isa.best_isa() if _isa.best_isa() != "amx" else "avx512"


@functools.lru_cache(maxsize=1)
def _native_ops() -> frozenset[str]:
    from ortfuse.custom_ops.registration import native_disabled_by_env, native_op_types, native_unavailable_reason

    if native_disabled_by_env():  # decided before numba is imported
        return frozenset()
    try:

        if native_unavailable_reason():  # no native path in this process: select no native kernel
            return frozenset()
        return native_op_types()
    except Exception:  # numba or the ABI layer unusable here: the reference path remains
        return frozenset()


def kernels_for(op: str, extra: tuple[Kernel, ...] = ()) -> list[Kernel]:
    """Every kernel registered for ``op``, best first."""
    found = [Kernel(op, REFERENCE, (ANY,), ("float32",), 0)]
    if op in _native_ops():
        found.append(Kernel(op, NATIVE, (native_isa(),), ("float32",), 10))
    found += [k for k in extra if k.op == op]
    return sorted(found, key=lambda k: -k.priority)


def select(op: str, dtype: str = "float32", prefer: str | None = None, extra: tuple[Kernel, ...] = ()) -> Selection:
    """The kernel this CPU runs for (op, dtype); ``prefer="reference"`` forces the reference path."""
    candidates = kernels_for(op, extra)
    if prefer == REFERENCE:
        candidates = [k for k in candidates if k.path == REFERENCE]
    have = _isa.supported_isas()
    for kernel in candidates:
        if dtype not in kernel.dtypes:
            continue
        if ANY in kernel.isas:
            return Selection(kernel, ANY)
        level = next((i for i in have if i in kernel.isas), None)
        if level is not None:
            return Selection(kernel, level)
    dtypes = sorted({d for k in candidates for d in k.dtypes})
    return Selection(None, reason=f"no {op} kernel for dtype {dtype} on this CPU ({', '.join(have)}); "
                                  f"kernels exist for {', '.join(dtypes)}")
