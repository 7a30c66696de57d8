"""Float16 elementwise native ops: ``FusedAddReluF16``, ``FusedHardSwishF16``, ``FusedSiLUF16``.

Same computes as the float32 ops (``native_ops._compute_binary`` / ``_compute_unary``: input count,
element type (the op's declared one, float16 here), rank and broadcast checks, blocks of ``BLOCK``
elements on ORT's pool); the workers widen ``CHUNK`` elements at a time from float16 to float32
(exact), run the float32 span kernels on them in a stack buffer, and round each result to float16
once (round to nearest even, as numpy's ``astype``)::

    y16 = f16(span_f32(f32(x16)))

ORT runs the unfused float16 subgraph op by op and rounds to float16 after each op, so the two
differ by a few float16 ulps at most; ours is the closer to the exact value (tests/test_native_f16.py
states both bounds).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core.extending import intrinsic

from ortfuse.custom_ops import abi
from ortfuse.custom_ops.abi import int_to_voidptr, load_i64, stack_bytes
from ortfuse.custom_ops.native import NativeOpDef, slot_f32
from ortfuse.custom_ops.native_ops import (
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
    _f32_view,
    add_relu_span,
    hardswish_span,
    row_offsets,
    silu_span,
)
from ortfuse.custom_ops.specs import FLOAT16_NATIVE

CHUNK = 1024  # elements widened at a time: the float32 chunks stay in L1
CHUNK_BYTES = 4 * CHUNK


@intrinsic
def f16_bits_to_f32(typingctx, bits):
    """The float32 value of the float16 whose bits are ``bits`` (uint16); exact (LLVM ``fpext``)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def f32_to_f16_bits(typingctx, value):
    """The bits (uint16) of ``value`` rounded to float16, to nearest even (LLVM ``fptrunc``)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@njit(cache=True)
def _u16_view(addr, n):
    return carray(int_to_voidptr(addr), (n,), np.uint16)


@njit(nogil=True, cache=True)
def widen(src, start, dst, n):
    """dst[:n] = float32(src[start:start + n]) (float16 bits in ``src``)."""
    s = src[start:start + n]
    for i in range(n):
        dst[i] = f16_bits_to_f32(s[i])


@njit(nogil=True, cache=True)
def narrow(src, dst, start, n):
    """dst[start:start + n] = float16 bits of src[:n], rounded to nearest even."""
    d = dst[start:start + n]
    for i in range(n):
        d[i] = f32_to_f16_bits(src[i])


# --------------------------------------------------------------------------------------------------
# FusedAddReluF16: relu(A + B), numpy broadcasting
# --------------------------------------------------------------------------------------------------


@njit(nogil=True, error_model="numpy", cache=True)
def add_relu_span_f16(a, b, o, oa, sa, ob, sb, oo, n, ta, tb, to):
    """``add_relu_span`` on float16 bits (strides 0 or 1), through the float32 chunks ``ta``, ``tb``, ``to``."""
    for c in range(0, n, CHUNK):
        m = min(CHUNK, n - c)
        if sa == 1:
            widen(a, oa + c, ta, m)
        else:
            ta[0] = f16_bits_to_f32(a[oa])
        if sb == 1:
            widen(b, ob + c, tb, m)
        else:
            tb[0] = f16_bits_to_f32(b[ob])
        add_relu_span(ta, tb, to, 0, sa, 0, sb, 0, m)  # not in place: LLVM vectorises only unaliased loops
        narrow(to, o, oo + c, m)


def _add_relu_f16_worker(args, block):
    a = _u16_view(load_i64(args + 8 * BA_A), load_i64(args + 8 * BA_NA))
    b = _u16_view(load_i64(args + 8 * BA_B), load_i64(args + 8 * BA_NB))
    o = _u16_view(load_i64(args + 8 * BA_O), load_i64(args + 8 * BA_N))
    ta = _f32_view(stack_bytes(CHUNK_BYTES), CHUNK)
    tb = _f32_view(stack_bytes(CHUNK_BYTES), CHUNK)
    to = _f32_view(stack_bytes(CHUNK_BYTES), CHUNK)
    plan = load_i64(args + 8 * BA_PLAN)
    m = load_i64(args + 8 * BA_M)
    rpb = load_i64(args + 8 * BA_RPB)
    inner = load_i64(args + 8 * BA_INNER)
    isa = load_i64(plan + 8 * (1 + 3 * (m - 1)) + 8)
    isb = load_i64(plan + 8 * (1 + 3 * (m - 1)) + 16)
    if rpb == 0:  # one row: this block is a slice of it
        s = block * BLOCK
        add_relu_span_f16(a, b, o, s * isa, isa, s * isb, isb, s, min(inner, s + BLOCK) - s, ta, tb, to)
        return
    rows = load_i64(args + 8 * BA_ROWS)
    for row in range(block * rpb, min(rows, (block + 1) * rpb)):
        oa, ob = row_offsets(plan, m, row)
        add_relu_span_f16(a, b, o, oa, isa, ob, isb, row * inner, inner, ta, tb, to)


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


def _hardswish_f16_worker(args, block):
    slot, x, y, s, e = unary_f16_block(args, block)
    t = _f32_view(stack_bytes(CHUNK_BYTES), CHUNK)
    u = _f32_view(stack_bytes(CHUNK_BYTES), CHUNK)  # a second buffer: LLVM vectorises only unaliased loops
    add, lo, hi, div = slot_f32(slot, HS_ADD), slot_f32(slot, HS_LO), slot_f32(slot, HS_HI), slot_f32(slot, HS_DIV)
    for c in range(s, e, CHUNK):
        m = min(CHUNK, e - c)
        widen(x, c, t, m)
        hardswish_span(t, u, 0, m, add, lo, hi, div)
        narrow(u, y, c, m)


def _silu_f16_worker(args, block):
    _slot, x, y, s, e = unary_f16_block(args, block)
    t = _f32_view(stack_bytes(CHUNK_BYTES), CHUNK)
    u = _f32_view(stack_bytes(CHUNK_BYTES), CHUNK)  # a second buffer: LLVM vectorises only unaliased loops
    for c in range(s, e, CHUNK):
        m = min(CHUNK, e - c)
        widen(x, c, t, m)
        silu_span(t, u, 0, m)
        narrow(u, y, c, m)


_F16 = {"input_type": abi.ONNX_TYPE_FLOAT16, "output_type": abi.ONNX_TYPE_FLOAT16}
F16_OP_DEFS = (
    NativeOpDef(FLOAT16_NATIVE["FusedAddRelu"], ("A", "B"), _compute_binary, _add_relu_f16_worker, **_F16),
    NativeOpDef(FLOAT16_NATIVE["FusedHardSwish"], ("X",), _compute_unary, _hardswish_f16_worker,
                attrs=(_f("add", HS_ADD), _f("lo", HS_LO), _f("hi", HS_HI), _f("div", HS_DIV)), **_F16),
    NativeOpDef(FLOAT16_NATIVE["FusedSiLU"], ("X",), _compute_unary, _silu_f16_worker, **_F16),
)
NATIVE_OPS.update({op.name: op for op in F16_OP_DEFS})
