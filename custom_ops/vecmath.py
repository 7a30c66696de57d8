"""Vectorisable float32 math for numba kernels: exp, tanh, erf, sigmoid, silu.

numba has no SVML on this machine, so ``np.exp`` / ``np.tanh`` / ``math.erf`` inside a loop stay
scalar libm calls (docs/ARCHITECTURE.md §10). The functions here are plain ``@numba.njit`` scalar functions over
float32 that inline into the caller's loop and vectorise there: polynomial / rational approximations,
Cody-Waite range reduction, and bit manipulation through LLVM intrinsics (``bitcast``, integer shift,
``llvm.fmuladd``, ``llvm.copysign``), never through ``np.view`` on temporary arrays. Per element there
are no branches beyond selects (``a if c else b`` lowers to ``select``); both sides of a range split are
computed.

Each function is its own numba function (compiled once, cached) marked ``alwaysinline`` for LLVM by
the ``always_inline()`` intrinsic, so LLVM inlines it into the caller's loop, which then vectorises.
numba's IR-level ``inline="always"`` does the same but made every kernel compile slower. The functions
use ``error_model="numpy"``: under numba's default ``error_model="python"`` each float division gets
a zero check that raises ZeroDivisionError, a branch that stops the loop from vectorising (measured:
4 ymm operands instead of 140 for a tanh loop). Callers that divide in their own loops need
``error_model="numpy"`` as well.

Every argument and every constant must be float32: numba promotes ``float32 op python_float`` to
float64, which would silently turn a kernel into float64 code. The constants below are ``np.float32``
module globals (numba freezes them as float32 constants).

Accuracy, measured against float64 libm over **every** float32 input (all 2**32 bit patterns,
``python -m ortfuse.custom_ops.vecmath --exhaustive``, numba on this host: AVX-512 with FMA
contraction). The ulp is that of the float32 format at the exact result; subnormal results count in
units of 2**-149. Right column: compiled for the ``generic`` ISA (SSE2, no FMA: ``llvm.fmuladd`` is a
separate multiply and add; ``NUMBA_CPU_NAME=generic NUMBA_CPU_FEATURES=+sse2``), also over all 2**32
inputs (*all*: a strided sweep can miss the worst input).

============  =================  ============  ===========================================================
function      max ulp (host)     generic       notes
============  =================  ============  ===========================================================
exp_f32       0.909 (x=5.1998)   1.176 *all*   overflow to +Inf for x > 88.7228, underflow through
                                               subnormals to +0 below -103.97 (numpy float32 semantics)
tanh_f32      1.954 (x=0.5196)   2.005 *all*   odd: tanh(-0) = -0; ±1 exactly for |x| >= 8.4911 (the
                                               exact value rounds to ±1 from 9.0109 on)
erf_f32       1.577 (x=0.8794)   1.798 *all*   odd: erf(-0) = -0; ±1 for |x| >= 3.92
sigmoid_f32   2.402 (x=-4.157)   2.402 *all*   1/(1+e^-x) for x >= 0, e^x/(1+e^x) below: subnormal
                                               results at x < -87.3 are kept (numpy's float32
                                               1/(1+exp(-x)) flushes them to 0)
silu_f32      2.394 (x=-16.685)  2.465 *all*   x * sigmoid(x) as x / (1 + e^-x); -0 below -88.376
                                               (|exact| < 3.7e-37 there), silu(-Inf) = NaN
============  =================  ============  ===========================================================

``MAX_ULP`` holds the larger of the two columns rounded up; tests/test_vecmath.py asserts them as
bounds. No input gives a special value that the float64 result does not round to (Inf, 0, NaN checked
exhaustively). NaN in gives NaN out for all five.

Decisions, each measured on loops over 64K floats in cache (``python tools/kernel_bench.py --cases
silu,chain_bias_tanh``, and this module's ``--exhaustive`` sweep for accuracy): the 2**n scaling is
``llvm.ldexp`` (``vscalefps``) on AVX-512 targets only; exp's polynomial is plain Horner form with
coefficients fitted by ``tools/fit_exp.py``; tanh goes through e**(-2|x|) - 1 with no separate
small-|x| polynomial. tanh, sigmoid and silu divide once per element (``divps``): faster and more
accurate (one rounding) than a Newton-corrected reciprocal in FMAs or LLVM's ``vrcp14ps`` estimate
plus a correction step; silu_f32 computes x / (1 + e**-x) with no select.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "MAX_ULP",
    "always_inline",
    "copysign_f32",
    "erf_f32",
    "exp_f32",
    "f32_as_i32",
    "fmuladd",
    "from_f32",
    "i32_as_f32",
    "prefer_512bit",
    "sigmoid_f32",
    "silu_f32",
    "tanh_f32",
    "to_f32",
    "ulp_error",
    "ulp_sweep",
]

F32 = np.float32
_F32_IR = ir.FloatType()
_I32_IR = ir.IntType(32)

# Measured maxima (see the module docstring: host and generic ISA), rounded up; tests assert these.
MAX_ULP = {"exp": 1.18, "tanh": 2.01, "erf": 1.80, "sigmoid": 2.41, "silu": 2.47}


# ---------------------------------------------------------------------------------------------
# intrinsics: one LLVM instruction each, so they vectorise with the loop around them
# ---------------------------------------------------------------------------------------------

@intrinsic
def f32_as_i32(typingctx, x):
    """Reinterpret the bits of a float32 as an int32 (LLVM ``bitcast``)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _I32_IR)
    return types.int32(types.float32), codegen


@intrinsic
def i32_as_f32(typingctx, i):
    """Reinterpret the bits of an int32 as a float32 (LLVM ``bitcast``)."""
    if i != types.int32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _F32_IR)
    return types.float32(types.int32), codegen


@intrinsic
def fmuladd(typingctx, a, b, c):
    """a * b + c as ``llvm.fmuladd.f32``: one fused FMA where the target has FMA, else mul + add."""
    if not (a == types.float32 and b == types.float32 and c == types.float32):
        return None

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32_IR, [_F32_IR] * 3),
                                            "llvm.fmuladd.f32")
        return builder.call(fn, args)
    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def to_f32(typingctx, v):
    """An array element as float32: a float32 as is, a uint16 as the float16 whose bits it holds
    (LLVM ``fpext``, exact: ``vcvtph2ps`` with F16C / AVX-512). Lets one loop serve both storage types."""
    if v == types.float32:
        return types.float32(v), lambda context, builder, sig, args: args[0]
    if v == types.uint16:
        return types.float32(v), lambda context, builder, sig, args: builder.fpext(
            builder.bitcast(args[0], ir.HalfType()), _F32_IR)
    return None


@intrinsic
def from_f32(typingctx, v, like):
    """float32 v as an element of array ``like``: float32 as is, or (uint16 array) the bits of v
    rounded to float16, to nearest even (LLVM ``fptrunc``, as numpy's ``astype``)."""
    if v != types.float32 or not isinstance(like, types.Array):
        return None
    if like.dtype == types.float32:
        return types.float32(v, like), lambda context, builder, sig, args: args[0]
    if like.dtype == types.uint16:
        return types.uint16(v, like), lambda context, builder, sig, args: builder.bitcast(
            builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return None


@intrinsic
def copysign_f32(typingctx, mag, sgn):
    """|mag| with the sign bit of sgn (``llvm.copysign.f32``; NaN stays NaN)."""
    if not (mag == types.float32 and sgn == types.float32):
        return None

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32_IR, [_F32_IR] * 2),
                                            "llvm.copysign.f32")
        return builder.call(fn, args)
    return types.float32(types.float32, types.float32), codegen


@intrinsic
def always_inline(typingctx):
    """Mark the function being compiled ``alwaysinline`` for LLVM: callers then inline it even in
    big loops (where the vectoriser needs it inlined), without numba's slow IR-level inlining."""
    def codegen(context, builder, sig, args):
        builder.function.attributes.add("alwaysinline")
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def prefer_512bit(typingctx):
    """Give the function being compiled the LLVM attribute ``"prefer-vector-width"="512"``: its loops
    vectorise with zmm registers where the target has AVX-512. numba's default target for this host
    (``rocketlake``) carries LLVM's tuning that prefers 256-bit vectors, so without this loops get
    ymm code. Only the math-heavy loops ask for it: zmm speeds up the transcendental ones in cache and
    slows down the L2-bound ones such as relu (``python tools/kernel_bench.py --dispatcher`` times
    both). On an AVX2 or SSE2 target the attribute changes nothing (no 512-bit registers)."""
    def codegen(context, builder, sig, args):
        # llvmlite only accepts its known attribute names through .add(); a string attribute is legal IR
        set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        return context.get_dummy_value()
    return types.none(), codegen


def _target_has_avx512(context) -> bool:
    """Whether numba compiles for a target with AVX-512F (NUMBA_CPU_FEATURES if set, else the host)."""
    get = getattr(context.codegen(), "_get_host_cpu_features", None)
    features = get() if get is not None else (numba.config.CPU_FEATURES or "")
    return "+avx512f" in features.split(",")


@intrinsic
def _scale_by_rounded(typingctx, p, m):
    """p * 2**n where ``m = n + 0x1.8p23`` (the float32 'magic number' rounding of n).

    n = bits(m) - bits(0x1.8p23) is exact for |n| < 2**22. One rounding for n in [-150, 128]:
    correctly rounded subnormal results and +Inf on overflow. Integer arithmetic wraps (no nsw), so
    any bits of m give defined results; NaN p stays NaN.

    With AVX-512 as ``llvm.ldexp``, which LLVM lowers to ``vscalefps`` plus one int-to-float conversion
    of n: 3 vector instructions instead of 9.
    Without AVX-512 LLVM would make ldexp a scalar libm call (``ldexpf``), so there it is two
    multiplies, 2**(n>>1) * 2**(n - (n>>1)), each power of two built with integer shifts; the
    results are the same.
    """
    if not (p == types.float32 and m == types.float32):
        return None

    def codegen(context, builder, sig, args):
        pv, mv = args
        n = builder.sub(builder.bitcast(mv, _I32_IR), ir.Constant(_I32_IR, 0x4B400000))
        if _target_has_avx512(context):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32_IR, [_F32_IR, _I32_IR]),
                                                "llvm.ldexp.f32.i32")
            return builder.call(fn, [pv, n])
        n1 = builder.ashr(n, ir.Constant(_I32_IR, 1))
        n2 = builder.sub(n, n1)
        bias = ir.Constant(_I32_IR, 127)
        s1 = builder.bitcast(builder.shl(builder.add(n1, bias), ir.Constant(_I32_IR, 23)), _F32_IR)
        s2 = builder.bitcast(builder.shl(builder.add(n2, bias), ir.Constant(_I32_IR, 23)), _F32_IR)
        return builder.fmul(builder.fmul(pv, s1), s2)
    return types.float32(types.float32, types.float32), codegen


@intrinsic
def _pow2_rounded(typingctx, m):
    """2**n as float32 where ``m = n + 0x1.8p23``, for n in [-126, 127], and +Inf for n = 128 (two
    integer operations)."""
    if m != types.float32:
        return None

    def codegen(context, builder, sig, args):
        e = builder.add(builder.bitcast(args[0], _I32_IR), ir.Constant(_I32_IR, 127 - 0x4B400000))
        return builder.bitcast(builder.shl(e, ir.Constant(_I32_IR, 23)), _F32_IR)
    return types.float32(types.float32), codegen


# ---------------------------------------------------------------------------------------------
# constants (float32 globals: frozen into the machine code as float32 immediates)
# ---------------------------------------------------------------------------------------------

_ZERO = F32(0.0)
_HALF = F32(0.5)
_ONE = F32(1.0)

# exp: x = n ln2 + r, |r| <= ln2/2; exp(r) ~ 1 + r + r**2 (c2 + ... + c6 r**4) in Horner form (6 FMAs),
# coefficients fitted for max relative error (3.8e-9 before rounding), tools/fit_exp.py.
_EXP_HI = F32(89.0)            # exp(89) > FLT_MAX: clamped inputs still overflow to +Inf
_EXP_LO = F32(-104.0)          # exp(-104) < 2**-150: rounds to +0
_LOG2E = F32(1.44269504088896341)
_MAGIC = F32(12582912.0)       # 0x1.8p23: adding it rounds to an integer in the low mantissa bits
_LN2_HI = F32(0.693359375)     # 9 significant bits: n * _LN2_HI is exact for |n| <= 2**15
_LN2_LO = F32(-2.12194440e-4)
_E6 = F32(0.001381458598189056)
_E5 = F32(0.008368715643882751)
_E4 = F32(0.04166838899254799)
_E3 = F32(0.1666652113199234)
_E2 = F32(0.4999999403953552)

# silu: x / (1 + e**-c) with c = x clamped to [-89, 87], so that n = round(-c / ln2) lies in [-126, 128]
# and 2**n is a normal power of two or, for n = 128, +Inf (two integer operations, _pow2_rounded).
# n = 128 from x <= -127.5 ln2 on: there 1 + e**-c is +Inf and the result -0 (|exact| < 3.7e-37).
_SILU_LO = F32(-89.0)
_SILU_HI = F32(87.0)           # e**-87 < 2**-125: 1 + e**-x rounds to 1 from x = 16.7 on anyway
SILU_FLUSH = -88.37626266479492  # -127.5 ln2: below (to within the float32 rounding of n), silu_f32 gives -0
SILU_FLUSH_ABS = 3.68e-37        # |exact silu| below SILU_FLUSH: at most 127.5 ln2 e**(-127.5 ln2)

# tanh: -tanh|x| = em / (em + 2), em = e**(-2|x|) - 1 by the exp reduction (no cancellation for small
# |x|: for n = 0, em = e**r - 1 is the polynomial without its leading 1), clamped at -2|x| >= -20
# (tanh(10) rounds to 1).
_TANH_LO = F32(-20.0)
_MINUS_TWO = F32(-2.0)

# erf: |x| < 0.875: x + x P(x^2), P degree 6 fitted (weighted least squares) to erf(x)/x - 1, so
#      the leading 2/sqrt(pi) is not rounded to float32;
#      else 1 - exp(-x^2) * R(t), t = 1 / (1 + x/2), R degree 7 fitted to erfc(x) exp(x^2) on [0.875, 4].
_ERF_SPLIT = F32(0.875)
_ERF_CLAMP = F32(4.0)          # erfc(4) = 1.5e-8 < half an ulp of 1: erf = 1 beyond
_P6 = F32(8.676601e-05)
_P5 = F32(-0.0008211405)
_P4 = F32(0.0052067763)
_P3 = F32(-0.026861599)
_P2 = F32(0.11283733)
_P1 = F32(-0.37612635)
_P0 = F32(0.12837917)          # 2/sqrt(pi) - 1: erf(x) = x + x (P(x^2)), the leading 1 kept exact
_R7 = F32(0.11954596)
_R6 = F32(-0.47192547)
_R5 = F32(0.56439394)
_R4 = F32(-0.104564264)
_R3 = F32(0.34827772)
_R2 = F32(0.25954834)
_R1 = F32(0.2849348)
_R0 = F32(-0.00015567814)


# ---------------------------------------------------------------------------------------------
# the functions (scalar float32 -> float32; inline into vectorised loops)
# ---------------------------------------------------------------------------------------------

@njit(nogil=True, error_model="numpy", cache=True)
def _exp_parts(x):
    """exp's range reduction and polynomial: (m, r, c) with x = n ln2 + r, |r| <= ln2/2,
    m = n + 0x1.8p23 and e**r ~= 1 + r + r**2 c."""
    always_inline()
    m = fmuladd(x, _LOG2E, _MAGIC)             # n + 0x1.8p23, n = round(x / ln2)
    n = m - _MAGIC
    r = fmuladd(n, -_LN2_HI, x)
    r = fmuladd(n, -_LN2_LO, r)
    return m, r, _exp_poly(r)


@njit(nogil=True, error_model="numpy", cache=True)
def _exp_poly(r):
    """c with e**r ~= 1 + r + r**2 c for |r| <= ln2/2 (Horner, 4 FMAs)."""
    always_inline()
    c = fmuladd(_E6, r, _E5)
    c = fmuladd(c, r, _E4)
    c = fmuladd(c, r, _E3)
    return fmuladd(c, r, _E2)


@njit(nogil=True, error_model="numpy", cache=True)
def _exp_le(x):
    """e**x for x <= 89 or NaN (no upper clamp: sigmoid only passes x <= 0)."""
    always_inline()
    x = _EXP_LO if x < _EXP_LO else x  # noqa: FURB136 - a select that keeps NaN (max() would not)
    m, r, c = _exp_parts(x)
    return _scale_by_rounded(fmuladd(fmuladd(c, r, _ONE), r, _ONE), m)


@njit(nogil=True, error_model="numpy", cache=True)
def exp_f32(x):
    """e**x in float32, max error 0.91 ulp (1.18 without FMA); NaN -> NaN, overflow -> +Inf,
    underflow -> +0."""
    always_inline()
    # clamp with a select that keeps NaN (a comparison with NaN is false, so x passes through)
    x = _EXP_HI if x > _EXP_HI else x  # noqa: FURB136 - min() would not keep NaN
    return _exp_le(x)


@njit(nogil=True, error_model="numpy", cache=True)
def tanh_f32(x):
    """tanh in float32, max error 1.95 ulp (2.01 without FMA); odd, NaN -> NaN.

    -tanh|x| = em / (em + 2) with em = e**(-2|x|) - 1 from exp's reduction -2|x| = n ln2 + r:
    em = 2**n (e**r - 1) + (2**n - 1), where e**r - 1 is the polynomial without its leading 1
    (no cancellation near 0: relative accuracy down to subnormal x), and the denominator
    2**n (e**r - 1) + (2**n + 1), in [1, 2], rounded once; one division."""
    always_inline()
    y = abs(x) * _MINUS_TWO
    y = _TANH_LO if y < _TANH_LO else y  # noqa: FURB136 - a select that keeps NaN
    m, r, c = _exp_parts(y)                    # n = round(y / ln2) in [-29, 0]
    p = fmuladd(c * r, r, r)                   # e**r - 1 = r + r**2 c, no cancellation
    s = _pow2_rounded(m)
    em = fmuladd(s, p, s - _ONE)               # e**y - 1 = 2**n (e**r - 1) + (2**n - 1), in (-1, 0]
    ep = fmuladd(s, p, s + _ONE)               # e**y + 1, rounded once (not 2 + em)
    return copysign_f32(em / ep, x)            # -tanh|x| = (e**-2|x| - 1) / (e**-2|x| + 1)


@njit(nogil=True, error_model="numpy", cache=True)
def erf_f32(x):
    """erf in float32, max error 1.58 ulp (1.80 without FMA); odd, NaN -> NaN."""
    always_inline()
    a = abs(x)
    z = a * a
    p = fmuladd(_P6, z, _P5)
    p = fmuladd(p, z, _P4)
    p = fmuladd(p, z, _P3)
    p = fmuladd(p, z, _P2)
    p = fmuladd(p, z, _P1)
    p = fmuladd(p, z, _P0)
    small = fmuladd(a, p, a)
    c = _ERF_CLAMP if a > _ERF_CLAMP else a  # noqa: FURB136 - NaN passes through
    t = _ONE / fmuladd(c, _HALF, _ONE)
    q = fmuladd(_R7, t, _R6)
    q = fmuladd(q, t, _R5)
    q = fmuladd(q, t, _R4)
    q = fmuladd(q, t, _R3)
    q = fmuladd(q, t, _R2)
    q = fmuladd(q, t, _R1)
    q = fmuladd(q, t, _R0)
    h = c * c
    lo = fmuladd(c, c, -h)                      # exact low part of c*c with FMA (0 without)
    e = exp_f32(-h)
    e = fmuladd(-e, lo, e)                      # exp(-(h + lo)) ~= exp(-h) (1 - lo)
    large = _ONE - e * q
    r = small if a < _ERF_SPLIT else large
    return copysign_f32(r, x)


@njit(nogil=True, error_model="numpy", cache=True)
def sigmoid_f32(x):
    """1 / (1 + e**-x) in float32, max error 2.40 ulp (also without FMA); NaN -> NaN,
    sigmoid(-Inf) = 0, (+Inf) = 1."""
    always_inline()
    e = _exp_le(-abs(x))
    num = _ONE if x >= _ZERO else e
    return num / (_ONE + e)


@njit(nogil=True, error_model="numpy", cache=True)
def silu_f32(x):
    """x * sigmoid(x) as x / (1 + e**-x) in float32, max error 2.39 ulp (2.47 without FMA; for
    x >= SILU_FLUSH); below SILU_FLUSH (about -88.38, where |exact| < 3.7e-37) the result is -0; silu(+Inf) = +Inf,
    silu(-Inf) = NaN (as x * sigmoid(x): -Inf * 0), NaN -> NaN.

    One ``divps`` and no select (faster than x * sigmoid_f32(x): ``python tools/kernel_bench.py --cases silu``).
    e**-c is exp's reduction and polynomial with 2**n by two integer operations, folded into the FMA
    that adds 1: d = p 2**n + 1."""
    always_inline()
    c = _SILU_LO if x < _SILU_LO else x  # noqa: FURB136 - selects that keep NaN
    c = _SILU_HI if c > _SILU_HI else c  # noqa: FURB136
    # exp's reduction of -c written out, so that the negation folds into the FMAs
    m = fmuladd(c, -_LOG2E, _MAGIC)            # n + 0x1.8p23, n = round(-c / ln2) in [-126, 128]
    r = fmuladd(m - _MAGIC, -_LN2_HI, -c)
    r = fmuladd(m - _MAGIC, -_LN2_LO, r)       # -c = n ln2 + r
    p = fmuladd(fmuladd(_exp_poly(r), r, _ONE), r, _ONE)  # e**r
    return x / fmuladd(p, _pow2_rounded(m), _ONE)


# ---------------------------------------------------------------------------------------------
# measuring: ulp error against float64 libm
# ---------------------------------------------------------------------------------------------

def ulp_error(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|y - ref| in float32 ulps at the exact value ``ref`` (float64); 2**-149 for subnormal results.

    Special values must match the float32 rounding of ``ref`` exactly (NaN <-> NaN, ±Inf <-> ±Inf,
    and a result that rounds to ±Inf must be ±Inf): otherwise the error is +Inf.
    """
    y = np.asarray(y, dtype=np.float32)
    ref = np.asarray(ref, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        ref32 = ref.astype(np.float32)
        exponent = np.frexp(np.abs(ref))[1]  # |ref| = m 2**e, m in [0.5, 1): ulp = 2**(e - 24)
        exponent = np.where(ref == 0, -125, exponent)  # frexp(0) gives e = 0; 0 is in the subnormal range
        ulp = np.ldexp(1.0, np.maximum(exponent - 24, -149))
        err = np.abs(y.astype(np.float64) - ref) / ulp
        special = ~np.isfinite(ref32) | ~np.isfinite(y)
        same = (np.isnan(ref32) & np.isnan(y)) | (ref32 == y)
        err = np.where(special, np.where(same, 0.0, np.inf), err)
    return err


_SWEEP_KERNELS = {}


def _sweep_kernel(name: str):
    """A parallel numba kernel: over the bit patterns start, start+step, ... < stop, returns
    (max ulp error, its input bits, count of non-finite mismatches)."""
    if name in _SWEEP_KERNELS:
        return _SWEEP_KERNELS[name]
    import math

    from numba import prange
    f32_fn = {"exp": exp_f32, "tanh": tanh_f32, "erf": erf_f32, "sigmoid": sigmoid_f32, "silu": silu_f32}[name]
    flush_x = SILU_FLUSH + 1e-4 if name == "silu" else -np.inf  # -0 accepted below (the rounding of n)
    if name == "exp":
        @njit(nogil=True, error_model="numpy")
        def ref64(v):
            return math.exp(v)
    elif name == "tanh":
        @njit(nogil=True, error_model="numpy")
        def ref64(v):
            return math.tanh(v)
    elif name == "erf":
        @njit(nogil=True, error_model="numpy")
        def ref64(v):
            return math.erf(v)
    elif name == "silu":
        @njit(nogil=True, error_model="numpy")
        def ref64(v):
            return v / (1.0 + math.exp(-v))
    else:
        @njit(nogil=True, error_model="numpy")
        def ref64(v):
            if v >= 0:
                return 1.0 / (1.0 + math.exp(-v))
            e = math.exp(v)
            return e / (1.0 + e)

    @njit(nogil=True, error_model="numpy", parallel=True)
    def sweep(start, stop, step, nchunks):
        total = (stop - start + step - 1) // step
        worst = np.zeros(nchunks)
        where = np.zeros(nchunks, dtype=np.int64)
        bad = np.zeros(nchunks, dtype=np.int64)
        per = (total + nchunks - 1) // nchunks
        for c in prange(nchunks):
            for k in range(c * per, min(total, (c + 1) * per)):
                bits = start + k * step
                x = i32_as_f32(np.int32(bits))
                y = f32_fn(x)
                r = ref64(np.float64(x))
                r32 = np.float32(r)
                if x < flush_x and y == 0 and abs(r) < SILU_FLUSH_ABS:
                    continue  # silu's documented -0 below SILU_FLUSH
                if not (math.isfinite(r32) and math.isfinite(y)):
                    if not ((math.isnan(r32) and math.isnan(y)) or r32 == y):
                        bad[c] += 1
                    continue
                _, e = math.frexp(abs(r))
                ulp = math.ldexp(1.0, max(e - 24, -149)) if r != 0 else math.ldexp(1.0, -149)
                err = abs(np.float64(y) - r) / ulp
                if err > worst[c]:
                    worst[c] = err
                    where[c] = bits
        i = np.argmax(worst)
        return worst[i], where[i], bad.sum()

    _SWEEP_KERNELS[name] = sweep
    return sweep


def ulp_sweep(name: str, step: int = 1, start: int = 0, stop: int = 1 << 32) -> tuple[float, float, int]:
    """Max ulp error of ``<name>_f32`` over the float32 bit patterns ``start:stop:step`` (all of them
    with the defaults). Returns (max ulp, input where it occurs, count of special-value mismatches)."""
    worst, bits, bad = _sweep_kernel(name)(start, stop, step, 64)
    x = np.array([bits], dtype=np.uint32).view(np.float32)[0]
    return float(worst), float(x), int(bad)


def _main(argv=None) -> int:
    import argparse
    import time
    ap = argparse.ArgumentParser(description="Measure the max ulp error of the vecmath functions.")
    ap.add_argument("--exhaustive", action="store_true", help="all 2**32 inputs (about a minute per function)")
    ap.add_argument("--step", type=int, default=4099, help="stride over bit patterns without --exhaustive")
    ap.add_argument("names", nargs="*", default=["exp", "tanh", "erf", "sigmoid", "silu"])
    args = ap.parse_args(argv)
    step = 1 if args.exhaustive else args.step
    for name in args.names:
        t0 = time.perf_counter()
        worst, x, bad = ulp_sweep(name, step)
        print(f"{name:8s} max {worst:.3f} ulp at x={x!r} ({x:.9g}); special-value mismatches: {bad}; "
              f"{(1 << 32) // step} inputs in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
