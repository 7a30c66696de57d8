"""``FusedAddRelu`` (relu(A + B), numpy broadcasting, float32) and ``FusedAddReluF16`` (float16
tensors): the same span kernel on float32 arrays or on float16 bits, where each sum is computed in
float32 and rounded to float16 once. That is bit-identical to ORT's float16 Add then Relu: the
float32 sum of two float16 values rounded to float16 is the correctly rounded float16 sum (24 >= 2 *
11 + 2 bits, so the double rounding is innocuous)."""

from __future__ import annotations

from numba import njit

from ortfuse.custom_ops import abi
from ortfuse.custom_ops.intrinsics import load_i64
from ortfuse.custom_ops.kernels.scalar import relu1
from ortfuse.custom_ops.native.broadcast import (
    BA_A,
    BA_B,
    BA_INNER,
    BA_M,
    BA_N,
    BA_NA,
    BA_NB,
    BA_O,
    BA_PLAN,
    BA_ROWS,
    BA_RPB,
    compute_binary,
    row_offsets,
)
from ortfuse.custom_ops.native.elementwise import BLOCK, f32_view, u16_view
from ortfuse.custom_ops.native.op_def import NativeOpDef
from ortfuse.custom_ops.vecmath import from_f32, to_f32


@njit(nogil=True, error_model="numpy", cache=True)
def add_relu_span(a, b, o, oa, sa, ob, sb, oo, n):
    """o[oo:oo+n] = relu(a[oa + i*sa] + b[ob + i*sb]) with strides 0 or 1; NaN propagates, -0 -> 0.
    Arrays of float32, or of float16 bits (uint16: the sum in float32, rounded to float16 once).

    Loops index slices from 0 (not ``a[oa + i]``): numba then drops its negative-index wraparound
    and LLVM vectorises the loop.
    """
    out = o[oo:oo + n]
    if sa == 1 and sb == 1:
        aa = a[oa:oa + n]
        bb = b[ob:ob + n]
        for i in range(n):
            out[i] = from_f32(relu1(to_f32(aa[i]) + to_f32(bb[i])), out)
    elif sa == 1:
        aa = a[oa:oa + n]
        bv = to_f32(b[ob])
        for i in range(n):
            out[i] = from_f32(relu1(to_f32(aa[i]) + bv), out)
    elif sb == 1:
        bb = b[ob:ob + n]
        av = to_f32(a[oa])
        for i in range(n):
            out[i] = from_f32(relu1(av + to_f32(bb[i])), out)
    else:
        r = from_f32(relu1(to_f32(a[oa]) + to_f32(b[ob])), out)
        for i in range(n):
            out[i] = r


@njit(cache=True)
def add_relu_rows(a, b, o, plan, m, row0, row1):
    inner = load_i64(plan + 8 * (1 + 3 * (m - 1)))
    isa = load_i64(plan + 8 * (1 + 3 * (m - 1)) + 8)
    isb = load_i64(plan + 8 * (1 + 3 * (m - 1)) + 16)
    for row in range(row0, row1):
        oa, ob = row_offsets(plan, m, row)
        add_relu_span(a, b, o, oa, isa, ob, isb, row * inner, inner)


@njit(nogil=True, cache=True)
def add_relu_block(a, b, o, args, block):
    """Block ``block`` of a FusedAddRelu compute (the args block ``compute_binary`` filled) on the
    views a, b, o: float32, or float16 bits."""
    plan = load_i64(args + 8 * BA_PLAN)
    m = load_i64(args + 8 * BA_M)
    rpb = load_i64(args + 8 * BA_RPB)
    if rpb == 0:  # one row: this block is a slice of it
        inner = load_i64(args + 8 * BA_INNER)
        isa = load_i64(plan + 8 * (1 + 3 * (m - 1)) + 8)
        isb = load_i64(plan + 8 * (1 + 3 * (m - 1)) + 16)
        s = block * BLOCK
        add_relu_span(a, b, o, s * isa, isa, s * isb, isb, s, min(inner, s + BLOCK) - s)
    else:
        rows = load_i64(args + 8 * BA_ROWS)
        add_relu_rows(a, b, o, plan, m, block * rpb, min(rows, (block + 1) * rpb))


def _add_relu_worker(args, block):
    add_relu_block(f32_view(load_i64(args + 8 * BA_A), load_i64(args + 8 * BA_NA)),
                   f32_view(load_i64(args + 8 * BA_B), load_i64(args + 8 * BA_NB)),
                   f32_view(load_i64(args + 8 * BA_O), load_i64(args + 8 * BA_N)), args, block)


def _add_relu_f16_worker(args, block):
    add_relu_block(u16_view(load_i64(args + 8 * BA_A), load_i64(args + 8 * BA_NA)),
                   u16_view(load_i64(args + 8 * BA_B), load_i64(args + 8 * BA_NB)),
                   u16_view(load_i64(args + 8 * BA_O), load_i64(args + 8 * BA_N)), args, block)


_F16 = {"input_type": abi.ONNX_TYPE_FLOAT16, "output_type": abi.ONNX_TYPE_FLOAT16}
NATIVE_OPS = (
    NativeOpDef("FusedAddRelu", ("A", "B"), compute_binary, _add_relu_worker),
    NativeOpDef("FusedAddReluF16", ("A", "B"), compute_binary, _add_relu_f16_worker, **_F16),
)
