"""``FusedNanToZero`` (float32): y = 0 where x is NaN, else x (bit for bit, infinities and -0 kept):
the graph's Where(IsNaN(x), 0, x) as one pass instead of ORT's two (the attention rule's guard)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.native.elementwise import compute_unary, map_span, unary_block
from ortfuse.custom_ops.native.op_def import NativeOpDef
from ortfuse.custom_ops.vecmath import always_inline

_ZERO = np.float32(0.0)


@njit(nogil=True, error_model="numpy", cache=True)
def nan_to_zero_f32(v):
    """v, or +0 for a NaN (v != v only for NaN): a compare and a blend per vector."""
    always_inline()
    return v if v == v else _ZERO


@njit(nogil=True, error_model="numpy", cache=True)
def nan_to_zero_span(x, y, s, e):
    map_span(x, y, s, e, nan_to_zero_f32)


def _nan_to_zero_worker(args, block):
    _slot, x, y, s, e = unary_block(args, block)
    nan_to_zero_span(x, y, s, e)


NATIVE_OPS = (NativeOpDef("FusedNanToZero", ("X",), compute_unary, _nan_to_zero_worker),)
