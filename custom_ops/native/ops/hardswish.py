"""``FusedHardSwish`` (x * clip(x + add, lo, hi) / div, float32) and ``FusedHardSwishF16`` (float16
tensors: each element widened to float32, computed, rounded to float16 once).

The float16 span multiplies by float32(1 / div) where that reciprocal is finite and non-zero: a
division per element would bound the loop by the divider, and the product is a float32 ulp from
dividing, far below the float16 rounding. ORT runs the unfused float16 subgraph op by op and rounds
after each, so the two differ by a few float16 ulps at most; ours is the closer to the exact value
(tests/test_native_f16.py states both bounds).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ortfuse.custom_ops import abi
from ortfuse.custom_ops.kernels.scalar import clip1
from ortfuse.custom_ops.native.elementwise import compute_unary, hint_ahead, hint_plan, unary_block, unary_f16_block
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.slots import slot_f32
from ortfuse.custom_ops.vecmath import from_f32, prefer_512bit, to_f32

# attribute words
HS_ADD, HS_LO, HS_HI, HS_DIV = 0, 1, 2, 3
ATTRS = tuple(AttrDef(name, "float", word) for name, word in (("add", HS_ADD), ("lo", HS_LO), ("hi", HS_HI),
                                                               ("div", HS_DIV)))


@njit(nogil=True, error_model="numpy", cache=True)
def hardswish_span(x, y, s, e, add, lo, hi, div):
    """y = x * (clip(x + add, lo, hi) / div) in float32; clip as np.minimum(np.maximum(.)): NaN in the
    value or a bound gives NaN, ties give the bound (eltwise.hardswish, bit-identical to the reference)."""
    limit, step = hint_plan(x.shape[0], s, e)
    for p in range(s, e, step):
        q = min(p + step, e)
        hint_ahead(x.ctypes.data, y.ctypes.data, x.itemsize, p, q, limit)
        xs = x[p:q]
        ys = y[p:q]
        for i in range(xs.shape[0]):
            v = xs[i]
            ys[i] = v * (clip1(v + add, lo, hi) / div)


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
                ys[i] = from_f32(v * (clip1(v + add, lo, hi) * rdiv), ys)
        else:  # div is 0, subnormal, infinite or NaN: divide, as the reference does
            for i in range(xs.shape[0]):
                v = to_f32(xs[i])
                ys[i] = from_f32(v * (clip1(v + add, lo, hi) / div), ys)


def _hardswish_worker(args, block):
    slot, x, y, s, e = unary_block(args, block)
    hardswish_span(x, y, s, e, slot_f32(slot, HS_ADD), slot_f32(slot, HS_LO), slot_f32(slot, HS_HI),
                   slot_f32(slot, HS_DIV))


def _hardswish_f16_worker(args, block):
    slot, x, y, s, e = unary_f16_block(args, block)
    hardswish_span_f16(x, y, s, e, slot_f32(slot, HS_ADD), slot_f32(slot, HS_LO), slot_f32(slot, HS_HI),
                       slot_f32(slot, HS_DIV))


NATIVE_OPS = (
    NativeOpDef("FusedHardSwish", ("X",), compute_unary, _hardswish_worker, attrs=ATTRS),
    NativeOpDef("FusedHardSwishF16", ("X",), compute_unary, _hardswish_f16_worker, attrs=ATTRS,
                input_type=abi.ONNX_TYPE_FLOAT16, output_type=abi.ONNX_TYPE_FLOAT16),
)
