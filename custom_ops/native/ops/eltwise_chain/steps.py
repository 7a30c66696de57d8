"""The steps of a chain on one chunk (numba): element math inlined into one loop per step and op,
the op switch outside the loops, so that with a constant op LLVM folds the switch and vectorises.

Float32 (``error_model="numpy"``: x/0 is +-Inf or NaN): Relu, LeakyRelu, Clip, HardSigmoid, Abs,
Neg, Floor, Ceil, Sqrt, Reciprocal, Add, Sub, Mul, Div, Max, Min use the reference's float32
operations (NaN propagates through Max/Min/Clip like numpy and ORT); Sigmoid, Tanh, Exp, Erf use
``vecmath`` (within ``vecmath.MAX_ULP``), in 512-bit vectors where the target has them; Log, Pow and
Softplus's log1p are libm calls (scalar), and Pow by a repeated exponent 2 or 3 is x*x or x*x*x, as
ORT computes it. The cheap ops' loops are vectorised inside ``_unary_loop``/``_binary_loop`` and keep
LLVM's 256-bit vectors (512-bit there made a chain whose first step streams X from memory slower);
``prefer_512bit`` on ``unary_step``/``binary_step`` leaves those loops 256-bit but about halves the
worker's machine code, at the same speed. Measure with ``python tools/chain_bench.py``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ortfuse.custom_ops.intrinsics import load_i64, prefetch_lines
from ortfuse.custom_ops.kernels.scalar import clip1, hardsigmoid1, max1, min1, relu1
from ortfuse.custom_ops.native.ops.eltwise_chain.encoding import (
    OP_ABS,
    OP_ADD,
    OP_CEIL,
    OP_CLIP,
    OP_DIV,
    OP_ERF,
    OP_EXP,
    OP_FLOOR,
    OP_HARDSIGMOID,
    OP_LEAKYRELU,
    OP_LOG,
    OP_MAX,
    OP_MIN,
    OP_MUL,
    OP_NEG,
    OP_POW,
    OP_RECIPROCAL,
    OP_RELU,
    OP_SIGMOID,
    OP_SOFTPLUS,
    OP_SQRT,
    OP_SUB,
    OP_TANH,
)
from ortfuse.custom_ops.native.ops.eltwise_chain.sizes import A_IN, A_NIN, A_OUT, K_FULL, PIECE
from ortfuse.custom_ops.vecmath import always_inline, erf_f32, exp_f32, prefer_512bit, sigmoid_f32, tanh_f32

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)


@njit(nogil=True, error_model="numpy", cache=True)
def _unary1(op, v, p0, p1):
    """Unary op ``op`` (a code < N_UNARY) of v, as reference.eltwise_chain in float32."""
    always_inline()
    if op == OP_RELU:
        return relu1(v)
    if op == OP_SIGMOID:
        return sigmoid_f32(v)
    if op == OP_TANH:
        return tanh_f32(v)
    if op == OP_EXP:
        return exp_f32(v)
    if op == OP_LOG:
        return math.log(v)
    if op == OP_ABS:
        return abs(v)
    if op == OP_NEG:
        return -v
    if op == OP_SQRT:
        return math.sqrt(v)
    if op == OP_RECIPROCAL:
        return _ONE / v
    if op == OP_ERF:
        return erf_f32(v)
    if op == OP_FLOOR:
        return np.floor(v)
    if op == OP_CEIL:
        return np.ceil(v)
    if op == OP_SOFTPLUS:  # log(1 + e^v) = max(v, 0) + log1p(e^-|v|); NaN stays NaN
        return (v if v > _ZERO else _ZERO) + math.log1p(exp_f32(-abs(v)))  # noqa: FURB136 - keeps NaN
    if op == OP_LEAKYRELU:
        return v if v >= _ZERO else v * p0
    if op == OP_CLIP:
        return clip1(v, p0, p1)
    return hardsigmoid1(v, p0, p1)


@njit(nogil=True, error_model="numpy", cache=True)
def _binary1(op, a, b):
    """Binary op ``op`` (a code >= N_UNARY) of (a, b); Max/Min as numpy's maximum/minimum."""
    always_inline()
    if op == OP_ADD:
        return a + b
    if op == OP_SUB:
        return a - b
    if op == OP_MUL:
        return a * b
    if op == OP_DIV:
        return a / b
    if op == OP_POW:
        return math.pow(a, b)
    if op == OP_MAX:
        return max1(a, b)
    return min1(a, b)


@njit(nogil=True, error_model="numpy", cache=True)
def _unary_loop(x, d, fresh, op, p0, p1):
    """d = op(x) (``fresh``: the chunk's first step, x is X's run) or d = op(d) in place. Two loops:
    one loop reading x that is called with x = d runs scalar (LLVM's alias check fails on equal
    addresses), so the in-place loop reads d itself."""
    always_inline()
    if fresh:
        for i in range(d.size):
            d[i] = _unary1(op, x[i], p0, p1)
    else:
        for i in range(d.size):
            d[i] = _unary1(op, d[i], p0, p1)


@njit(nogil=True, error_model="numpy", cache=True)
def _unary_loop_512(d, op):
    """d = op(d) in place, in 512-bit vectors where the target has them (vecmath.prefer_512bit): LLVM
    vectorises the loop when it compiles this function, so the attribute must sit here."""
    always_inline()
    prefer_512bit()
    for i in range(d.size):
        d[i] = _unary1(op, d[i], _ZERO, _ZERO)


@njit(nogil=True, error_model="numpy", cache=True)
def _binary_loop(x, d, fresh, c, cv, scalar, op, swap):
    """d = op(x, c) (swap: op(c, x)) when ``fresh`` (the chunk's first step), else d = op(d, c) in
    place; c is the array c, or the value cv when ``scalar``."""
    always_inline()
    n = d.size
    if fresh:
        if scalar:
            if swap:
                for i in range(n):
                    d[i] = _binary1(op, cv, x[i])
            else:
                for i in range(n):
                    d[i] = _binary1(op, x[i], cv)
        elif swap:
            for i in range(n):
                d[i] = _binary1(op, c[i], x[i])
        else:
            for i in range(n):
                d[i] = _binary1(op, x[i], c[i])
    elif scalar:
        if swap:
            for i in range(n):
                d[i] = _binary1(op, cv, d[i])
        else:
            for i in range(n):
                d[i] = _binary1(op, d[i], cv)
    elif swap:
        for i in range(n):
            d[i] = _binary1(op, c[i], d[i])
    else:
        for i in range(n):
            d[i] = _binary1(op, d[i], c[i])


# Dispatch: every branch passes its op as a constant, so once LLVM inlines the loop it holds one op's
# math and vectorises. (A loop over a tuple of op codes instead relies on LLVM fully unrolling it,
# which it did not do for the 11 cheap unary ops: the Relu loop stayed scalar.)


@njit(nogil=True, error_model="numpy", cache=True)
def unary_step(x, d, fresh, op, p0, p1, args, nxt, ahead):
    """d = op(x) (``fresh``) or d = op(d) in place: one loop per op, the switch outside the loops.
    A polynomial op prefetches output elements [nxt, nxt + ahead) while it runs (``prefetch_ahead``)."""
    prefer_512bit()  # see the module docstring: the cheap ops' loops stay 256-bit, the code half as large
    if op == OP_RELU:
        _unary_loop(x, d, fresh, OP_RELU, p0, p1)
    elif op == OP_LOG:
        _unary_loop(x, d, fresh, OP_LOG, p0, p1)
    elif op == OP_ABS:
        _unary_loop(x, d, fresh, OP_ABS, p0, p1)
    elif op == OP_NEG:
        _unary_loop(x, d, fresh, OP_NEG, p0, p1)
    elif op == OP_SQRT:
        _unary_loop(x, d, fresh, OP_SQRT, p0, p1)
    elif op == OP_RECIPROCAL:
        _unary_loop(x, d, fresh, OP_RECIPROCAL, p0, p1)
    elif op == OP_FLOOR:
        _unary_loop(x, d, fresh, OP_FLOOR, p0, p1)
    elif op == OP_CEIL:
        _unary_loop(x, d, fresh, OP_CEIL, p0, p1)
    elif op == OP_LEAKYRELU:
        _unary_loop(x, d, fresh, OP_LEAKYRELU, p0, p1)
    elif op == OP_CLIP:
        _unary_loop(x, d, fresh, OP_CLIP, p0, p1)
    elif op == OP_HARDSIGMOID:
        _unary_loop(x, d, fresh, OP_HARDSIGMOID, p0, p1)
    else:
        if fresh:  # X into the chunk, then in place: the math dwarfs this pass through L1
            for i in range(d.size):
                d[i] = x[i]
        for s in range(0, d.size, PIECE):
            if s < ahead:
                prefetch_ahead(args, nxt + s, min(PIECE, ahead - s))
            _unary_math_step(d[s:s + PIECE], op)


@njit(nogil=True, cache=True)
def prefetch_ahead(args, pos, count):
    """Cache hints for output elements [pos, pos + count): the output's lines with intent to write, and
    the lines of each input read as a run of its buffer (K_FULL). A chunk's polynomial step runs
    from L1 with no memory traffic of its own; hinting the next chunk meanwhile keeps loads and
    write-allocations of main memory in flight (``python tools/kernel_bench.py --cases chain_bias_tanh``
    against a copy)."""
    always_inline()
    prefetch_lines(load_i64(args + 8 * A_OUT) + 4 * pos, 4 * count, True)
    for j in range(load_i64(args + 8 * A_NIN)):
        base = args + 8 * (A_IN + 3 * j)
        if load_i64(base + 16) == K_FULL:
            prefetch_lines(load_i64(base) + 4 * pos, 4 * count, False)


@njit(nogil=True, error_model="numpy", cache=True)
def _unary_math_step(d, op):
    """The polynomial ops, in 512-bit vectors where the target has them."""
    if op == OP_SIGMOID:
        _unary_loop_512(d, OP_SIGMOID)
    elif op == OP_TANH:
        _unary_loop_512(d, OP_TANH)
    elif op == OP_EXP:
        _unary_loop_512(d, OP_EXP)
    elif op == OP_ERF:
        _unary_loop_512(d, OP_ERF)
    elif op == OP_SOFTPLUS:
        _unary_loop_512(d, OP_SOFTPLUS)


@njit(nogil=True, error_model="numpy", cache=True)
def binary_step(x, d, fresh, c, cv, scalar, op, swap):
    """d = op(x, c) or op(c, x) (``fresh``), or op(d, c) or op(c, d) in place; c an array or
    (``scalar``) the value cv."""
    prefer_512bit()  # as in unary_step
    if op == OP_ADD:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_ADD, swap)
    elif op == OP_SUB:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_SUB, swap)
    elif op == OP_MUL:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_MUL, swap)
    elif op == OP_DIV:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_DIV, swap)
    elif op == OP_MAX:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_MAX, swap)
    elif op == OP_MIN:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_MIN, swap)
    elif scalar and not swap and (cv == np.float32(2.0) or cv == np.float32(3.0)):
        cube = cv == np.float32(3.0)  # ORT's Pow by a repeated exponent 2 or 3: x*x or x*x*x
        if fresh:
            for i in range(d.size):
                v = x[i]
                d[i] = v * v * (v if cube else _ONE)
        else:
            for i in range(d.size):
                v = d[i]
                d[i] = v * v * (v if cube else _ONE)
    else:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_POW, swap)
