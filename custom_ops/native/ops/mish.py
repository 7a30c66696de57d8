"""``FusedMish`` (x * tanh(softplus(x)), float32) and ``FusedMishF16`` (float16 tensors: each element
widened to float32, computed, rounded to float16 once): one span kernel, as the silu family.

The element math (``mish_f32``), with e = e**x from vecmath's ``exp_f32``: tanh(softplus(x)) =
((1 + e)**2 - 1) / ((1 + e)**2 + 1) = n / (n + 2), n = e (e + 2), so y = x n / (n + 2), one division.
The exp argument is clamped at 20 (beyond it n / (n + 2) is 1 in float32; nothing overflows).
Below x = -64 the ratio is e to a relative e / 2 < 2**-92, but e**x there is tiny or subnormal and
x * e would carry e's rounding to a subnormal (up to |x| / 2 units of 2**-149): there the span
computes (x e**(x + 64)) e**-64 instead (x + 64 is exact for x in [-128, -64], and e**-64 is a normal
float32), a single rounding into the subnormal range, selected per element (both sides computed).
Specials as the reference x * tanh(log1p(e**x)): NaN -> NaN, +Inf -> +Inf, -Inf -> NaN (-Inf * 0),
-0 -> -0.

Accuracy (decision: the bound ``MAX_ULP`` that tests/test_mish.py asserts): over every float32 input,
against x * tanh(log1p(e**x)) in float64, at most 3.95 ulp of the float32 result with FMA (avx2 and
up) and 3.98 ulp on the generic ISA (SSE2, no FMA), both near x = -13.8 where the five roundings
(e**x, n, n + 2, the division, the product) add up; subnormal results in units of 2**-149, special
values matching exactly. Measured with ``python -m ortfuse.custom_ops.native.ops.mish --step 1`` (all
2**32 inputs; ``--step N``: every N-th bit pattern), and for the generic variant with
``NUMBA_CPU_NAME=generic NUMBA_CPU_FEATURES=+sse2`` (and a separate ``NUMBA_CACHE_DIR``) in front.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ortfuse.custom_ops import abi
from ortfuse.custom_ops.native.elementwise import compute_unary, map_span, unary_block, unary_f16_block
from ortfuse.custom_ops.native.op_def import NativeOpDef
from ortfuse.custom_ops.vecmath import always_inline, exp_f32, fmuladd

MAX_ULP = 3.98  # the larger measured maximum over all float32 inputs, rounded up (module docstring)

_TWO = np.float32(2.0)
_EXP_CLAMP = np.float32(20.0)  # e**20 = 4.9e8: n / (n + 2) = 1 in float32 from here on, n finite
_SHIFT_BELOW = np.float32(-64.0)  # below: y = (x e**(x + 64)) e**-64
_SHIFT = np.float32(64.0)
_UNSHIFT = np.float32(np.exp(-64.0))  # e**-64 = 1.6e-28, a normal float32 (relative error < 2**-24)


@njit(nogil=True, error_model="numpy", cache=True)
def mish_f32(x):
    """x * tanh(softplus(x)) in float32 (the module docstring: the math and its bound)."""
    always_inline()
    small = x < _SHIFT_BELOW
    a = x + _SHIFT if small else x
    a = _EXP_CLAMP if a > _EXP_CLAMP else a  # noqa: FURB136 - a select that keeps NaN (min() would not)
    e = exp_f32(a)
    n = fmuladd(e, e, e + e)  # e (e + 2) rounded once (with FMA)
    return (x * e) * _UNSHIFT if small else x * (n / (n + _TWO))


@njit(nogil=True, error_model="numpy", cache=True)
def mish_span(x, y, s, e):
    """y = mish(x) on elements [s, e): x and y of float32, or of float16 bits (uint16: widened,
    rounded to float16 once)."""
    map_span(x, y, s, e, mish_f32)


def _mish_worker(args, block):
    _slot, x, y, s, e = unary_block(args, block)
    mish_span(x, y, s, e)


def _mish_f16_worker(args, block):
    _slot, x, y, s, e = unary_f16_block(args, block)
    mish_span(x, y, s, e)


NATIVE_OPS = (
    NativeOpDef("FusedMish", ("X",), compute_unary, _mish_worker),
    NativeOpDef("FusedMishF16", ("X",), compute_unary, _mish_f16_worker,
                input_type=abi.ONNX_TYPE_FLOAT16, output_type=abi.ONNX_TYPE_FLOAT16),
)


@njit(nogil=True, error_model="numpy", cache=True)
def _ulp_sweep(start, stop, step):
    """(max ulp error, its input's bits, special-value mismatches) of ``mish_span`` over the float32 bit
    patterns start, start + step, ... < stop, against x * tanh(log1p(e**x)) in float64; results
    below 2**-126 in units of 2**-149 (as ``vecmath.ulp_error``). Serial: a measuring tool."""
    bits = np.empty(4096, np.uint32)
    y = np.empty(4096, np.float32)
    worst, where, bad = 0.0, 0, 0
    k = start
    while k < stop:
        m = min(bits.size, (stop - k + step - 1) // step)
        for i in range(m):
            bits[i] = np.uint32(k + i * step)
        x = bits[:m].view(np.float32)
        mish_span(x, y, 0, m)
        for i in range(m):
            v = np.float64(x[i])
            r = v * math.tanh(math.log1p(math.exp(v)))
            r32 = np.float32(r)
            if not (math.isfinite(r32) and math.isfinite(y[i])):
                if not ((math.isnan(r32) and math.isnan(y[i])) or r32 == y[i]):
                    bad += 1
                continue
            e = math.frexp(abs(r))[1] if r != 0 else -125
            err = abs(np.float64(y[i]) - r) / math.ldexp(1.0, max(e - 24, -149))
            if err > worst:
                worst, where = err, k + i * step
        k += m * step
    return worst, where, bad


def _main(argv=None) -> int:
    import argparse
    import time

    from ortfuse.custom_ops.numba_setup import configure_numba

    ap = argparse.ArgumentParser(description="Measure the max ulp error of the FusedMish element math.")
    ap.add_argument("--step", type=int, default=4099, help="stride over the 2**32 bit patterns (1: all of them)")
    args = ap.parse_args(argv)
    configure_numba()
    t0 = time.perf_counter()
    worst, where, bad = _ulp_sweep(0, 1 << 32, args.step)
    x = np.array([where], np.uint32).view(np.float32)[0]
    print(f"mish max {worst:.3f} ulp at x={float(x)!r}; special-value mismatches: {bad}; "
          f"{((1 << 32) + args.step - 1) // args.step} inputs in {time.perf_counter() - t0:.1f} s (bound {MAX_ULP})")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
