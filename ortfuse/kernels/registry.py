"""Kernel registry: which kernels can run a fused op, and which one this CPU gets.

A kernel is (op, path, ISAs, dtypes, priority[, form, variants]). Paths:
- ``native``: numba cfuncs registered as ORT custom ops (no GIL, no copies); op type = the spec name.
  numba compiles them for one ISA per process (DESIGN.md §4b): the level whose ``isa.numba_env``
  this process was started with, else the host's best level (numba's default target is the host).
- ``lowered``: the match rewritten into operators ORT already has (``com.microsoft:FusedConv``,
  MatMul + ``BiasGelu``, ...; ``ortfuse.kernels.lowering``, rule ``form``), for the epilogues in
  ``variants``; a rule that ends in a native op (Conv + FusedHardSwish) is offered only where that
  native op is. Which path wins is measured (``LOWERED_PRIORITY``), not guessed.
- ``reference``: the numpy reference through onnxruntime-extensions' Python-op path; op type
  ``<name>Ref``; any ISA, float32; always available, lowest priority.
Dtypes: float32 everywhere; the elementwise native kernels also come in float16 (op types
``specs.FLOAT16_NATIVE``), so a float16 match without the native path is left unfused, with the reason.
Precision: every kernel computes float32 products unless its ``precision`` says otherwise. The AMX
kernel of FusedGemmAct (native op ``FusedGemmActBf16``: bf16 products, float32 accumulation, isa
``amx``) is a candidate only when the caller opts in (``select(..., precision="bf16")``; sessions take
it from the SessionOptions config entry ``ortfuse.precision``, tools from ``$ORTFUSE_PRECISION``), the
features report amx-tile + amx-bf16, and this process can run it (host CPU, Linux permission).
``select`` returns the highest-priority kernel whose ISA this CPU supports, whose dtype and variant
(the match's ``activation``) match and that fits the match (``fits``: a lowering rule may not apply,
e.g. FusedGemm needs a 2-D input), or the reason there is none (the rewriter then leaves the match
unfused with that reason).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from ortfuse.kernels import isa as _isa
from ortfuse.custom_ops.specs import FLOAT16_NATIVE, SPECS

NATIVE, REFERENCE, LOWERED = "native", "reference", "lowered"
PATHS = (NATIVE, LOWERED, REFERENCE)
NO_NATIVE = "no-native"  # a preference, not a path: every kernel that runs without the native ops
LOWERED_ONLY = "lowered-only"  # a preference: lowered kernels that need no native op (ORT's own ops only)
REFERENCE_LABEL = "reference (numpy through onnxruntime-extensions Python op)"
NATIVE_MAX_RANK = 12  # custom_ops.native.MAX_RANK: native kernels reject tensors of higher rank at run time
ANY = "any"
FP32, BF16 = "fp32", "bf16"
PRECISIONS = (FP32, BF16)
PRECISION_ENV = "ORTFUSE_PRECISION"        # tools: the precision opt-in for every fuse() in the process
PRECISION_OPTION = "ortfuse.precision"     # sessions: the SessionOptions config entry (wins over the env)


@dataclass(frozen=True)
class Kernel:
    op: str
    path: str
    isas: tuple[str, ...]
    dtypes: tuple[str, ...]
    priority: int
    form: str = ""  # lowered: the ``lowering.RULES`` key
    variants: tuple[str, ...] = ()  # the epilogues (``activation`` values) served; () = every one
    precision: str = FP32  # FP32: float32 products; BF16: bf16 products, chosen only under that opt-in
    native_op: str = ""  # native: the op type when it is not ``op`` (another numeric contract)

    @property
    def uses_native(self) -> bool:
        """True when this kernel needs the native ops registered: a native kernel, or a lowered rule
        that ends in a native op (its ISA is then the native one, not ``any``)."""
        return self.path == NATIVE or (self.path == LOWERED and ANY not in self.isas)

    @property
    def op_type(self) -> str:
        """The custom op type of a single fused node ("" for a lowered kernel: ORT's own ops)."""
        if self.path == LOWERED:
            return ""
        return (self.native_op or self.op) if self.path == NATIVE else SPECS[self.op].ref_op_type

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
            from ortfuse.kernels.lowering import LABEL_PREFIX, RULES

            return LABEL_PREFIX + RULES[self.kernel.form].summary
        extra = f" ({self.kernel.precision} products)" if self.kernel.precision != FP32 else ""
        return f"native numba {self.isa}" + (" float16" if self.kernel.dtypes == ("float16",) else "") + extra


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


# Lowered kernels: (lowering rule, epilogue) -> priority; native kernels are 10, reference 0.
#
# Measured 2026-12-02 with `python tools/lowering_bench.py --runs 10 --repeats 5` (every conv and GEMM
# match of resnet50:1, mobilenetv3_block:1, mlp_gemm_relu_gelu:1 and :64, bert_encoder:1, grouped per
# op and epilogue; ORT 1.32 at ORT_ENABLE_ALL, intra-op spinning off; 2 shared vCPUs at load average
# 3.6-4.8 from other jobs), plus reruns (`--only ... --runs 20 --repeats 7`; `--spin --gap-ms 50`;
# `--case bert_encoder:1 --case bert_encoder:4 --runs 15 --repeats 7`). Figures: p50 / p50 of the
# unfused subgraph at ORT_ENABLE_ALL, per run; the A/A control (a second identical ORT session) of
# those runs spanned 0.86-1.13 (three groups with A/A 0.75, 1.57 and 2.56 are discarded).
# - reference (numpy, Python op) vs everything: 5.4-55x, every op and epilogue -> it only backs up.
# - GEMM native vs lowered: native 0.86-1.50 at batch 1, behind the best lowered form of the same
#   run every time (once by 0.6%), and 3.1-10.4 at batch 64 (bert batch 4: 6.7); the lowered forms
#   0.73-1.17 -> lowered above native for every GEMM epilogue.
# - GEMM relu: FusedGemm 0.90-1.01 vs MatMul+Add+Relu 0.97-1.00: a tie; FusedGemm is one node (2-D
#   input only; MatMul+Add+Relu takes any rank).
# - GEMM erf-gelu: MatMul+Add+Gelu (ORT turns it into Gemm+Gelu, its own choice) 0.96-1.12 vs
#   MatMul+BiasGelu 1.00-1.41 (mlp; better in 7 of 8 runs); bert batch 4 0.986 vs 0.988.
# - GEMM tanh-gelu: MatMul+Add+FastGelu 0.74-0.98 vs MatMul+FastGelu(bias) 0.80-0.94: a tie (5 of 8).
# - relu+gelu: the one form, MatMul+Add+Relu+Gelu, 0.98-1.17 (native 1.00-6.2). relu+gelu_tanh
#   (no zoo instance) is ranked like relu+gelu, unmeasured.
# - conv + HardSwish (mobilenetv3, 8 convs): Conv + native FusedHardSwish 0.43-0.67 (5 runs) vs
#   Conv + HardSwish 0.82-0.91 vs Conv + HardSigmoid + Mul 0.81-0.91 (a tie between the two; the
#   HardSwish op is one node). Without the native path the HardSwish op is used (opset >= 14).
# - conv + SiLU (4 convs): Conv + Sigmoid + Mul (ORT makes QuickGelu) 0.87-1.00 vs Conv + native
#   FusedSiLU 0.90-1.04: a tie, the ORT ops ahead in 3 of 4 runs and needing no custom op.
# - conv relu / hardsigmoid (resnet50 33 convs, mobilenetv3 SE 4+4): FusedConv 0.97-1.16 vs Conv +
#   activation op 0.91-1.10: a tie; FusedConv is one node (what ORT makes itself). Clip (relu6; no zoo
#   instance) is the same FusedConv node, unmeasured. No epilogue (Conv+BN): Conv 0.94-0.99.
# - conv + residual + relu (resnet50, 16): FusedConv with Z 0.96-1.05 vs Conv+Add+Relu 0.95-1.05: a
#   tie; one node. Conv+Add+Relu remains for residuals of unknown shape (FusedConv's Z does not broadcast).
# The margins between lowered forms are inside the A/A noise of these machines; the margins against
# native GEMMs, the native HardSwish epilogue and the reference path are not.
LOWERED_PRIORITY: dict[tuple[str, str], int] = {
    ("fusedconv", "relu"): 30, ("fusedconv", "clip"): 30, ("fusedconv", "hardsigmoid"): 30,
    ("conv_ort_epilogue", "relu"): 20, ("conv_ort_epilogue", "clip"): 20, ("conv_ort_epilogue", "hardsigmoid"): 20,
    ("conv", ""): 30,
    ("conv_native_epilogue", "hardswish"): 30,
    ("conv_ort_epilogue", "hardswish"): 26,
    ("conv_decomposed_epilogue", "hardswish"): 25,
    ("conv_ort_epilogue", "silu"): 30,
    ("conv_native_epilogue", "silu"): 25,
    ("fusedconv_sum", "relu"): 30,
    ("conv_add_relu", "relu"): 25,
    ("fusedgemm", "relu"): 30,
    ("matmul_add_act", "relu"): 25,
    ("matmul_add_act", "gelu"): 30,
    ("matmul_biasgelu", "gelu"): 25,
    ("matmul_add_act", "gelu_tanh"): 30,
    ("matmul_fastgelu", "gelu_tanh"): 25,
    ("matmul_add_act", "relu+gelu"): 30,
    ("matmul_add_act", "relu+gelu_tanh"): 30,
}
UNMEASURED_PRIORITY = 1  # a rule/epilogue pair nobody measured: above the reference only


def lowered_kernels(native: frozenset[str] | None = None) -> list[Kernel]:
    """The lowered kernels this process can run, one per (rule, epilogue), each with its measured
    priority; an epilogue whose rule ends in a native op not available here is left out
    (``native``: the native op types; default ``_native_ops()``)."""
    from ortfuse.kernels.lowering import RULES

    native = _native_ops() if native is None else native
    found = []
    for form, rule in RULES.items():
        for variant in rule.activations:
            needs = rule.native_ops.get(variant, "")
            if needs and needs not in native:
                continue
            isas = (native_isa(),) if needs else (ANY,)
            priority = LOWERED_PRIORITY.get((form, variant), UNMEASURED_PRIORITY)
            found.append(Kernel(rule.op, LOWERED, isas, ("float32",), priority, form, (variant,)))
    return found


# FusedGemmAct -> native FusedGemmActBf16 (AMX bf16 tiles, custom_ops/native_amx.py): listed where the
# (possibly overridden) features have amx-tile + amx-bf16; selected only under the bf16 precision
# opt-in and only when this process can run it (``_amx_unavailable_reason``). Priority above every
# float32 kernel, measured 2026-12-02 with `python tools/amx_bench.py --runs 15 --repeats 5` (Xeon with
# AMX, 2 shared vCPUs at load average 5.4-5.6; Gemm+bias+Relu vs stock ORT at ORT_ENABLE_ALL, A/A
# control 0.94-1.12): AMX p50 / ORT p50 = 0.64 (M=1, K=N=1024), 0.42 (1x4096x4096), 0.26 (64x1024x1024),
# 0.17 (64x4096x4096), 0.30 (64x512x1024), 0.19 (1024^3) at 1 intra-op thread; 0.18-0.64 at 2.
AMX_OP = "FusedGemmActBf16"
AMX_PRIORITY = 40


def amx_kernels() -> list[Kernel]:
    if not {"amx-tile", "amx-bf16"} <= _isa.cpu_features() or not _native_ops():
        return []
    return [Kernel("FusedGemmAct", NATIVE, ("amx",), ("float32",), AMX_PRIORITY, precision=BF16, native_op=AMX_OP)]


# Below K x N = 256 x 256 the AMX kernel's fixed cost (tile configuration, X conversion pass, two
# block passes: ~3 us) outweighs its speed: 1x64x64 1.46x and 8x128x128 1.24x stock ORT's time,
# 32x256x256 0.62x (same command, --runs 30, load average 4.1-4.5).
AMX_MIN_WEIGHTS = 256 * 256


def amx_misfit(match) -> str:
    """Why the AMX kernel does not suit a FusedGemmAct match ("" when it does): its W must be a 2-D
    initializer the rewriter writes (packed once per kernel) of at least AMX_MIN_WEIGHTS elements."""
    w = next((t for t in match.initializers if t.name == match.inputs[1]), None)
    if w is None or len(w.dims) != 2:
        return f"{AMX_OP} needs W as a 2-D initializer"
    if w.dims[0] * w.dims[1] < AMX_MIN_WEIGHTS:
        return f"{AMX_OP}: W of {w.dims[0]}x{w.dims[1]} is below {AMX_MIN_WEIGHTS} weights, where AMX loses"
    return ""


@functools.lru_cache(maxsize=1)
def _amx_unavailable_reason() -> str | None:
    """Why the AMX kernel cannot run in this process (host CPU, native path, Linux permission), or None."""
    from ortfuse.custom_ops.native_amx import unavailable_reason

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
    if op in _native_ops():
        found.append(Kernel(op, NATIVE, (native_isa(),), ("float32",), 10))
        if op in FLOAT16_NATIVE:  # compiled and registered with the float32 ones (custom_ops/native_f16.py)
            found.append(Kernel(op, NATIVE, (native_isa(),), ("float16",), 10, native_op=FLOAT16_NATIVE[op]))
    found += [k for k in lowered_kernels() if k.op == op]
    found += [k for k in amx_kernels() if k.op == op]
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
    misfits = []
    for kernel in candidates:
        if dtype not in kernel.dtypes:
            continue
        if ANY in kernel.isas:
            level = ANY
        else:
            level = next((i for i in have if i in kernel.isas), None)
            if level is None:
                continue
        why_not = fits(kernel) if fits is not None else ""
        if not why_not and kernel.native_op == AMX_OP:
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
    return Selection(None, reason=f"no {op} kernel{path} for dtype {dtype} on this CPU ({', '.join(have)}); "
                                  f"kernels exist for {', '.join(dtypes) or 'no dtype'}")
