"""Kernel registry: which kernels can run a fused op, and which one this CPU gets
(docs/ARCHITECTURE.md §5). The kernels are those the fusion rules declare
(``ortfuse.fusion.catalogue``), each listed where this process can run it.

A kernel is (op, path, ISAs, dtypes, priority[, form, variants]). Paths:
- ``native``: numba cfuncs registered as ORT custom ops (no GIL, no copies), declared by a rule as a
  ``NativeKernel``: the spec's own op type for float32, or a variant (float16 op types of the
  elementwise ops; the AMX GEMM with bf16 products). numba compiles them for one ISA per process
  (docs/ARCHITECTURE.md §5): the level of numba's target in this process (``isa.numba_env`` of a
  level, else the host's: numba's default). That level is the kernel's ISA and its label, whatever
  ``ORTFUSE_ISA`` says; an override without it leaves the native kernels out.
- ``lowered``: the match rewritten into operators ORT already has (``com.microsoft:FusedConv``,
  MatMul + ``BiasGelu``, ...), by a rule's ``LoweringForm`` named ``form``, for the epilogues in
  ``variants``; a form that ends in a native op (Conv + FusedHardSwish) is offered only where that
  native op is. Which path wins is measured (each form's priorities), not guessed.
- ``reference``: the numpy reference through onnxruntime-extensions' Python-op path; op type
  ``<name>Ref``; any ISA, float32; always available, lowest priority.
Dtypes: float32 everywhere; the elementwise native kernels also come in float16, so a float16 match
without the native path is left unfused, with the reason.
Precision: every kernel computes float32 products unless its ``precision`` says otherwise. A kernel
with bf16 products (the AMX GEMM, isa ``amx``) is a candidate only when the caller opts in
(``select(..., precision="bf16")``; sessions take it from the SessionOptions config entry
``ortfuse.precision``, tools from ``$ORTFUSE_PRECISION``), the features report what it declares
(amx-tile + amx-bf16), and this process can run it (host CPU, Linux permission).
``select`` returns the highest-priority kernel whose ISA this CPU supports, whose dtype and variant
(the match's ``activation``) match and that fits the match (``fits``: a lowering form may not apply,
e.g. FusedGemm needs a 2-D input), or the reason there is none (the rewriter then leaves the match
unfused with that reason).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

from ortfuse.custom_ops.native import words as _native_words
from ortfuse.foundation import isa as _isa
from ortfuse.foundation.session_options import PRECISION_OPTION  # sessions: the config entry (wins over the env)
from ortfuse.fusion import catalogue

NATIVE, REFERENCE, LOWERED = "native", "reference", "lowered"
PATHS = (NATIVE, LOWERED, REFERENCE)
NO_NATIVE = "no-native"  # a preference, not a path: every kernel that runs without the native ops
LOWERED_ONLY = "lowered-only"  # a preference: lowered kernels that need no native op (ORT's own ops only)
REFERENCE_LABEL = "reference (numpy through onnxruntime-extensions Python op)"
NATIVE_MAX_RANK: int = _native_words.MAX_RANK  # native kernels fail a run on tensors of higher rank
ANY = "any"
FP32, BF16 = "fp32", "bf16"
PRECISIONS = (FP32, BF16)
PRECISION_ENV = "ORTFUSE_PRECISION"        # tools: the precision opt-in for every fuse() in the process
AMX = "amx"  # the ISA level of kernels that also need this process's permission to use AMX


@dataclass(frozen=True)
class Kernel:
    op: str
    path: str
    isas: tuple[str, ...]
    dtypes: tuple[str, ...]
    priority: int
    form: str = ""  # lowered: the ``catalogue.LOWERING_FORMS`` key
    variants: tuple[str, ...] = ()  # the epilogues (``activation`` values) served; () = every one
    precision: str = FP32  # FP32: float32 products; BF16: bf16 products, chosen only under that opt-in
    native_op: str = ""  # native: the op type when it is not ``op`` (another dtype or numeric contract)
    misfit: Callable | None = field(default=None, compare=False)  # match -> why it does not suit ("" = it does)

    @property
    def uses_native(self) -> bool:
        """True when this kernel needs the native ops registered: a native kernel, or a lowered form
        that ends in a native op (its ISA is then the native one, not ``any``)."""
        return self.path == NATIVE or (self.path == LOWERED and ANY not in self.isas)

    @property
    def op_type(self) -> str:
        """The custom op type of a single fused node ("" for a lowered kernel: ORT's own ops)."""
        if self.path == LOWERED:
            return ""
        return (self.native_op or self.op) if self.path == NATIVE else catalogue.SPECS[self.op].ref_op_type

    def serves(self, variant: str) -> bool:
        return not self.variants or variant in self.variants


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
        if self.kernel.path == LOWERED:
            from ortfuse.fusion.rulekit.lowering import LABEL_PREFIX  # imports onnx: only for lowered kernels

            return LABEL_PREFIX + catalogue.LOWERING_FORMS[self.kernel.form].summary
        extra = f" ({self.kernel.precision} products)" if self.kernel.precision != FP32 else ""
        return f"native numba {self.isa}" + (" float16" if self.kernel.dtypes == ("float16",) else "") + extra


def native_isa() -> str:
    """The ISA level numba compiles the native kernels for in this process (``KERNEL_ISAS``): from
    numba's target (``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES``, read at numba's import), else the
    host's. ``ORTFUSE_ISA`` does not change it: a native kernel is listed at this level, so under an
    override that lacks it (a pretended CPU that could not run that code) it is not selected."""
    return _isa.target_level(*_isa.numba_target())


@functools.lru_cache(maxsize=1)
def _native_ops() -> frozenset[str]:
    from ortfuse.custom_ops.native.availability import native_disabled_by_env
    from ortfuse.custom_ops.registration import native_op_types, native_unavailable_reason

    if native_disabled_by_env():  # decided before numba is imported
        return frozenset()
    try:

        if native_unavailable_reason():  # no native path in this process: select no native kernel
            return frozenset()
        return native_op_types()
    except Exception:  # numba or the ABI layer unusable here: the reference path remains
        return frozenset()


def native_kernels(native: frozenset[str] | None = None) -> list[Kernel]:
    """The native kernels the rules declare that this process can list: their op type is registered
    by the native path (``native``: those op types; default ``_native_ops()``) and the (possibly
    overridden) CPU features include what they need."""
    native = _native_ops() if native is None else native
    found = []
    for k in catalogue.NATIVE_KERNELS:
        if k.name not in native or not set(k.cpu_features) <= _isa.cpu_features():
            continue
        found.append(Kernel(k.op, NATIVE, (k.isa or native_isa(),), (k.dtype,), k.priority, precision=k.precision,
                            native_op=k.op_type if k.name != k.op else "", misfit=k.misfit))
    return found


def lowered_kernels(native: frozenset[str] | None = None) -> list[Kernel]:
    """The lowered kernels this process can run, one per (form, epilogue), each with the priority its
    rule states; an epilogue whose form ends in a native op not available here is left out
    (``native``: the native op types; default ``_native_ops()``)."""
    native = _native_ops() if native is None else native
    found = []
    for form in catalogue.LOWERING_FORMS.values():
        for variant, priority in form.priorities.items():
            needs = form.native_ops.get(variant, "")
            if needs and needs not in native:
                continue
            isas = (native_isa(),) if needs else (ANY,)
            found.append(Kernel(form.op, LOWERED, isas, ("float32",), priority, form.name, (variant,)))
    return found


@functools.lru_cache(maxsize=1)
def _amx_unavailable_reason() -> str | None:
    """Why kernels of ISA ``amx`` cannot run in this process (host CPU, native path, Linux permission), or None."""
    from ortfuse.custom_ops.native.ops.gemm_bf16 import unavailable_reason

    return unavailable_reason()


def resolve_precision(precision: str | None = None) -> str:
    """The precision opt-in: ``precision`` if given, else ``$ORTFUSE_PRECISION``, else fp32."""
    value = (precision or os.environ.get(PRECISION_ENV, "") or FP32).strip().lower()
    if value not in PRECISIONS:
        raise ValueError(f"unknown precision {value!r} ({PRECISION_OPTION} / {PRECISION_ENV}); use one of "
                         f"{', '.join(PRECISIONS)}")
    return value


def kernels_for(op: str, extra: tuple[Kernel, ...] = ()) -> list[Kernel]:
    """Every kernel registered for ``op``, best first."""
    found = [Kernel(op, REFERENCE, (ANY,), ("float32",), 0)]
    found += [k for k in native_kernels() if k.op == op]
    found += [k for k in lowered_kernels() if k.op == op]
    found += [k for k in extra if k.op == op]
    return sorted(found, key=lambda k: -k.priority)


_amx_warned: list[bool] = [False]


def _warn_amx(reason: str) -> None:
    if not _amx_warned[0]:
        _amx_warned[0] = True
        warnings.warn(f"ortfuse: bf16 precision allowed but the AMX kernel cannot run here ({reason}); "
                      "float32 kernels used", stacklevel=4)


def _preferred(kernel: Kernel, prefer: str | None) -> bool:
    """``prefer``: None (any path), a path name, ``lowered:<form>`` (that one rule), or
    ``NO_NATIVE`` (any kernel that runs without the native ops: the fallback when they cannot be registered)."""
    if prefer is None:
        return True
    if prefer == NO_NATIVE:
        return not kernel.uses_native
    if prefer == LOWERED_ONLY:
        return kernel.path == LOWERED and not kernel.uses_native
    if prefer.startswith(LOWERED + ":"):
        return kernel.path == LOWERED and kernel.form == prefer.split(":", 1)[1]
    return kernel.path == prefer


def select(op: str, dtype: str = "float32", prefer: str | None = None, extra: tuple[Kernel, ...] = (),
           variant: str = "", fits: Callable[[Kernel], str] | None = None, precision: str = FP32) -> Selection:
    """The kernel this CPU runs for (op, dtype, variant).

    ``precision``: FP32 (the default) never selects a reduced-precision kernel; BF16 (the opt-in)
    lets kernels with bf16 products compete by priority too.

    ``prefer`` restricts the paths: ``"reference"`` forces the reference path, ``"native"`` /
    ``"lowered"`` that path, ``"lowered:<form>"`` one lowering rule (benchmarks, the tuner), ``NO_NATIVE``
    every kernel that runs without the native ops.
    ``fits(kernel)`` returns "" when the kernel can run this match, else why not."""
    if prefer is not None and prefer not in (*PATHS, NO_NATIVE, LOWERED_ONLY) and not prefer.startswith(LOWERED + ":"):
        raise ValueError(f"unknown kernel preference {prefer!r}; use one of {', '.join(PATHS)} or lowered:<form>")
    allowed = {FP32, resolve_precision(precision)}
    candidates = [k for k in kernels_for(op, extra)
                  if _preferred(k, prefer) and k.serves(variant) and k.precision in allowed]
    have = _isa.supported_isas()
    misfits, elsewhere = [], set()
    for kernel in candidates:
        if dtype not in kernel.dtypes:
            continue
        if ANY in kernel.isas:
            level = ANY
        else:
            level = next((i for i in have if i in kernel.isas), None)
            if level is None:
                elsewhere |= set(kernel.isas)
                continue
        why_not = fits(kernel) if fits is not None else ""
        if not why_not and AMX in kernel.isas:
            why_not = _amx_unavailable_reason() or ""
            if why_not:
                _warn_amx(why_not)
        if why_not:
            misfits.append(why_not)
            continue
        return Selection(kernel, level)
    if misfits:
        return Selection(None, reason=f"no {op} kernel fits this match: {'; '.join(misfits)}")
    dtypes = sorted({d for k in candidates for d in k.dtypes})
    path = f" on path {prefer}" if prefer else ""
    built = f" ({dtype} ones compiled for {', '.join(sorted(elsewhere))})" if elsewhere else ""
    return Selection(None, reason=f"no {op} kernel{path} for dtype {dtype} on this CPU ({', '.join(have)}); "
                                  f"kernels exist for {', '.join(dtypes) or 'no dtype'}{built}")
