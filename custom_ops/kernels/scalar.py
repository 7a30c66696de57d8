"""Element functions (float32 -> float32) with the reference's semantics, inlined into the kernels'
loops: NaN propagates, ties of max/min give the second operand as numpy's do (relu(-0) = +0), gelu
and gelu_tanh use ``vecmath`` (docs/ARCHITECTURE.md §10)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.vecmath import always_inline, erf_f32, tanh_f32

F32 = np.float32
ZERO = F32(0.0)
ONE = F32(1.0)
HALF = F32(0.5)
_INV_SQRT2 = F32(0.7071067811865476)
_SQRT_2_OVER_PI = F32(0.7978845608028654)
_GELU_K = F32(0.044715)


@njit(nogil=True, error_model="numpy", cache=True)
def relu1(v):
    always_inline()
    # np.where(x > 0, x, where(isnan(x), x, 0)): NaN stays, -0 -> +0
    return v if (v > ZERO or v != v) else ZERO  # noqa: PLR0124 - v != v: NaN


@njit(nogil=True, error_model="numpy", cache=True)
def max1(v, lo):
    always_inline()
    # np.maximum: NaN in either operand gives NaN; ties give the second operand
    return v if (v > lo or v != v) else lo  # noqa: PLR0124


@njit(nogil=True, error_model="numpy", cache=True)
def min1(v, hi):
    always_inline()
    return v if (v < hi or v != v) else hi  # noqa: PLR0124


@njit(nogil=True, error_model="numpy", cache=True)
def clip1(v, lo, hi):
    always_inline()
    return min1(max1(v, lo), hi)


@njit(nogil=True, error_model="numpy", cache=True)
def hardsigmoid1(v, alpha, beta):
    always_inline()
    return clip1(alpha * v + beta, ZERO, ONE)


@njit(nogil=True, error_model="numpy", cache=True)
def gelu1(v):
    always_inline()
    return (HALF * v) * (ONE + erf_f32(v * _INV_SQRT2))


@njit(nogil=True, error_model="numpy", cache=True)
def gelu_tanh1(v):
    always_inline()
    inner = _SQRT_2_OVER_PI * (v + ((_GELU_K * v) * v) * v)
    return (HALF * v) * (ONE + tanh_f32(inner))
