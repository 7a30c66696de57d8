"""``FusedSiLU`` (x * sigmoid(x), float32) and ``FusedSiLUF16`` (float16 tensors): one span kernel,
compiled for float32 arrays and for float16 bits (each element widened to float32, computed with
vecmath's ``silu_f32``, rounded to float16 once).

This module is the smallest complete unary op family: a span, a worker per dtype, the ``NativeOpDef``s."""

from __future__ import annotations

from numba import njit

from ortfuse.custom_ops import abi
from ortfuse.custom_ops.native.elementwise import compute_unary, map_span, unary_block, unary_f16_block
from ortfuse.custom_ops.native.op_def import NativeOpDef
from ortfuse.custom_ops.vecmath import silu_f32


@njit(nogil=True, error_model="numpy", cache=True)
def silu_span(x, y, s, e):
    """y = x * sigmoid(x) in float32 with vecmath's silu_f32 (as eltwise.silu: a few ulp from the
    reference's x * (1 / (1 + exp(-x))); -0 below x = -88.38, where the exact value is above -3.7e-37).
    x and y of float32, or of float16 bits (uint16: widened, rounded to float16 once)."""
    map_span(x, y, s, e, silu_f32)


def _silu_worker(args, block):
    _slot, x, y, s, e = unary_block(args, block)
    silu_span(x, y, s, e)


def _silu_f16_worker(args, block):
    _slot, x, y, s, e = unary_f16_block(args, block)
    silu_span(x, y, s, e)


NATIVE_OPS = (
    NativeOpDef("FusedSiLU", ("X",), compute_unary, _silu_worker),
    NativeOpDef("FusedSiLUF16", ("X",), compute_unary, _silu_f16_worker,
                input_type=abi.ONNX_TYPE_FLOAT16, output_type=abi.ONNX_TYPE_FLOAT16),
)
