"""Float16 elementwise native ops: ``FusedAddReluF16``, ``FusedHardSwishF16``, ``FusedSiLUF16``.

Same computes as the float32 ops (``native_ops._compute_binary`` / ``_compute_unary``: input count,
element type (the op's declared one, float16 here), rank and broadcast checks, blocks of ``BLOCK``
elements on ORT's pool). The workers make one pass: each element is widened from float16 to float32
(exact, ``vecmath.to_f32``: ``vcvtph2ps``), computed in float32 and rounded to float16 once
(``vecmath.from_f32``, to nearest even as numpy's ``astype``); AddRelu and SiLU are the float32 ops'
span kernels themselves, compiled for arrays of float16 bits::

    y16 = f16(f(f32(x16)))

ORT runs the unfused float16 subgraph op by op and rounds to float16 after each op, so the two
differ by a few float16 ulps at most; ours is the closer to the exact value (tests/test_native_f16.py
states both bounds). AddRelu is bit-identical to ORT's float16 Add then Relu: the float32 sum of two
float16 values rounded to float16 is the correctly rounded float16 sum (24 >= 2 * 11 + 2 bits, so the
double rounding is innocuous). HardSwish multiplies by float32(1 / div) where that reciprocal is finite
and non-zero (a division per element bounds the loop by the divider: 64K elements 12.6 -> 9.5 us),
a float32 ulp away from dividing, far below the float16 rounding.

One pass instead of widening a chunk into an L1 buffer, computing it into a second one and
narrowing that (the first version): 64K elements in cache, HardSwish 15.0 -> 13.1 us with the
division, SiLU 18.0 -> 16.1 us; 32M elements, HardSwish 14.2 -> 9.8 ms.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from ortfuse.custom_ops import abi
from ortfuse.custom_ops.abi import int_to_voidptr, load_i64
from ortfuse.custom_ops.native import NativeOpDef, slot_f32
from ortfuse.custom_ops.native_ops import (
    BA_A,
    BA_B,
    BA_N,
    BA_NA,
    BA_NB,
    BA_O,
    BLOCK,
    HS_ADD,
    HS_DIV,
    HS_HI,
    HS_LO,
    NATIVE_OPS,
    UA_N,
    UA_SLOT,
    UA_X,
    UA_Y,
    _compute_binary,
    _compute_unary,
    _f,
    add_relu_block,
    hint_ahead,
    hint_plan,
    silu_span,
)
from ortfuse.custom_ops.kernels.eltwise import _clip1
from ortfuse.custom_ops.specs import FLOAT16_NATIVE
from ortfuse.custom_ops.vecmath import from_f32, prefer_512bit, to_f32


@njit(cache=True)
def _u16_view(addr, n):
    return carray(int_to_voidptr(addr), (n,), np.uint16)


# --------------------------------------------------------------------------------------------------
# FusedAddReluF16: relu(A + B), numpy broadcasting
# --------------------------------------------------------------------------------------------------


def _add_relu_f16_worker(args, block):
    add_relu_block(_u16_view(load_i64(args + 8 * BA_A), load_i64(args + 8 * BA_NA)),
                   _u16_view(load_i64(args + 8 * BA_B), load_i64(args + 8 * BA_NB)),
                   _u16_view(load_i64(args + 8 * BA_O), load_i64(args + 8 * BA_N)), args, block)


# --------------------------------------------------------------------------------------------------
# FusedHardSwishF16, FusedSiLUF16
# --------------------------------------------------------------------------------------------------


@njit(cache=True)
def unary_f16_block(args, block):
    """(slot, x, y, start, end) of one block of a unary compute, x and y as float16 bits."""
    n = load_i64(args + 8 * UA_N)
    s = block * BLOCK
    return (load_i64(args + 8 * UA_SLOT), _u16_view(load_i64(args + 8 * UA_X), n),
            _u16_view(load_i64(args + 8 * UA_Y), n), s, min(n, s + BLOCK))


@njit(nogil=True, error_model="numpy", cache=True)
def hardswish_span_f16(x, y, s, e, add, lo, hi, div):
    """y = f16(v * (clip(v + add, lo, hi) / div)), v = f32(x), on float16 bits; the division as a
    multiply by float32(1 / div) when that is finite and non-zero (then a float32 ulp from dividing)."""
    prefer_512bit()
    rdiv = np.float32(1) / div
    by_rdiv = math.isfinite(rdiv) and rdiv != np.float32(0)
    limit, step = hint_plan(x.shape[0], s, e)
    for p in range(s, e, step):
        q = min(p + step, e)
        hint_ahead(x.ctypes.data, y.ctypes.data, x.itemsize, p, q, limit)
        xs = x[p:q]
        ys = y[p:q]
        if by_rdiv:
            for i in range(xs.shape[0]):
                v = to_f32(xs[i])
                ys[i] = from_f32(v * (_clip1(v + add, lo, hi) * rdiv), ys)
        else:  # div is 0, subnormal, infinite or NaN: divide, as the reference does
            for i in range(xs.shape[0]):
                v = to_f32(xs[i])
                ys[i] = from_f32(v * (_clip1(v + add, lo, hi) / div), ys)


def _hardswish_f16_worker(args, block):
    slot, x, y, s, e = unary_f16_block(args, block)
    hardswish_span_f16(x, y, s, e, slot_f32(slot, HS_ADD), slot_f32(slot, HS_LO), slot_f32(slot, HS_HI),
                       slot_f32(slot, HS_DIV))


def _silu_f16_worker(args, block):
    _slot, x, y, s, e = unary_f16_block(args, block)
    silu_span(x, y, s, e)


_F16 = {"input_type": abi.ONNX_TYPE_FLOAT16, "output_type": abi.ONNX_TYPE_FLOAT16}
F16_OP_DEFS = (
    NativeOpDef(FLOAT16_NATIVE["FusedAddRelu"], ("A", "B"), _compute_binary, _add_relu_f16_worker, **_F16),
    NativeOpDef(FLOAT16_NATIVE["FusedHardSwish"], ("X",), _compute_unary, _hardswish_f16_worker,
                attrs=(_f("add", HS_ADD), _f("lo", HS_LO), _f("hi", HS_HI), _f("div", HS_DIV)), **_F16),
    NativeOpDef(FLOAT16_NATIVE["FusedSiLU"], ("X",), _compute_unary, _silu_f16_worker, **_F16),
)
NATIVE_OPS.update({op.name: op for op in F16_OP_DEFS})
