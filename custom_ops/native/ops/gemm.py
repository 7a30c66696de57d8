"""``FusedGemmAct``: act(X[..., K] @ W[K, N] + B[N]) in float32, blocked over N and K, the epilogue
applied to each column block while it is in cache.

The epilogue is the ``activation`` attribute, read once in CreateKernel as '+'-joined tokens from
``NATIVE_GEMM_EPILOGUES`` (``""`` or absent = none); any other token makes session creation fail
with a message naming the accepted tokens. ``gemm_io`` (inputs, shape checks, output) and
``activation_span`` (the epilogue) serve the bf16 variant as well.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from ortfuse.custom_ops.abi import ORT_INVALID_ARGUMENT
from ortfuse.custom_ops.intrinsics import int_to_voidptr, load_i64, stack_bytes, store_i64
from ortfuse.custom_ops.kernels.scalar import gelu1, gelu_tanh1, relu1
from ortfuse.custom_ops.native.elementwise import f32_view
from ortfuse.custom_ops.native.inputs import (
    check_input_count,
    element_count,
    fail,
    make_output,
    msg_begin,
    read_float_input,
)
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.slots import slot_api, slot_i64
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import DIMS_BYTES, MAX_RANK, MSG_CAP
from ortfuse.custom_ops.status_messages import cstr, msg_put, msg_put_dims, msg_status
from ortfuse.custom_ops.vecmath import prefer_512bit, silu_f32

GEMM_SCRATCH = 4 * DIMS_BYTES  # stack buffer of gemm_io: dims of X, W, B and Y

NATIVE_GEMM_EPILOGUES = ("relu", "gelu", "gelu_tanh", "silu")
ACT_RELU, ACT_GELU, ACT_GELU_TANH, ACT_SILU = 0, 1, 2, 3
GEMM_MAX_STEPS = 4
GA_ACT = 0  # attribute words: [count, code0..code3]
CODES_BYTES = 8 * GEMM_MAX_STEPS

_T_GEMM_X = cstr("X must have rank >= 1, got a scalar")
_T_GEMM_W = cstr("W must have shape [K, N] with K = last dim of X; got X ")
_T_GEMM_B = cstr("B must have shape [N] with N = W's last dim; got W ")
_T_W = cstr(" and W ")
_T_B = cstr(" and B ")


@njit(nogil=True, error_model="numpy", cache=True)
def activation_span(y, s, e, codes, steps):
    """Apply the activation steps (codes of NATIVE_GEMM_EPILOGUES) to y[s:e] in place, as reference.activation,
    with eltwise's element functions (gelu, gelu_tanh, silu through vecmath: a few ulp from the
    reference; relu exact). One vectorised loop per step, the switch outside the loops."""
    prefer_512bit()
    ys = y[s:e]
    for k in range(steps):
        c = codes[k]
        if c == ACT_RELU:
            for i in range(ys.shape[0]):
                ys[i] = relu1(ys[i])
        elif c == ACT_GELU:
            for i in range(ys.shape[0]):
                ys[i] = gelu1(ys[i])
        elif c == ACT_GELU_TANH:
            for i in range(ys.shape[0]):
                ys[i] = gelu_tanh1(ys[i])
        elif c == ACT_SILU:
            for i in range(ys.shape[0]):
                ys[i] = silu_f32(ys[i])


GEMM_NB = 512   # output columns per block
GEMM_KB = 256   # depth per block


@njit(cache=True)
def gemm_rows(x, w, b, y, m0, m1, k, n, codes, steps):
    """y[m0:m1, :] = act(x[m0:m1, :] @ w + b), row-major flat arrays, blocked over N and K."""
    for j0 in range(0, n, GEMM_NB):
        j1 = min(n, j0 + GEMM_NB)
        width = j1 - j0
        bb = b[j0:j1]
        for i in range(m0, m1):
            yr = y[i * n + j0:i * n + j1]
            for j in range(width):
                yr[j] = bb[j]
        for p0 in range(0, k, GEMM_KB):
            p1 = min(k, p0 + GEMM_KB)
            for i in range(m0, m1):
                yr = y[i * n + j0:i * n + j1]
                xr = x[i * k:(i + 1) * k]
                for p in range(p0, p1):
                    xv = xr[p]
                    wr = w[p * n + j0:p * n + j1]
                    for j in range(width):
                        yr[j] += xv * wr[j]
        if steps > 0:  # epilogue on this column block while it is still in cache
            for i in range(m0, m1):
                activation_span(y, i * n + j0, i * n + j1, codes, steps)


# args block of FusedGemmAct (int64 words)
GA_SLOT, GA_X, GA_W, GA_B, GA_Y, GA_M, GA_K, GA_N, GA_RPB, GA_CODES, GA_STEPS = range(11)
GEMM_ARGS_BYTES = 8 * 12
GEMM_BLOCKS = 16  # row blocks per call (enough to balance a few threads)


def _gemm_worker(args, block):
    m = load_i64(args + 8 * GA_M)
    k = load_i64(args + 8 * GA_K)
    n = load_i64(args + 8 * GA_N)
    rpb = load_i64(args + 8 * GA_RPB)
    x = f32_view(load_i64(args + 8 * GA_X), m * k)
    w = f32_view(load_i64(args + 8 * GA_W), k * n)
    b = f32_view(load_i64(args + 8 * GA_B), n)
    y = f32_view(load_i64(args + 8 * GA_Y), m * n)
    codes = carray(int_to_voidptr(load_i64(args + 8 * GA_CODES)), (GEMM_MAX_STEPS,), np.int64)
    gemm_rows(x, w, b, y, block * rpb, min(m, (block + 1) * rpb), k, n, codes, load_i64(args + 8 * GA_STEPS))


@njit(cache=True)
def _gemm_shape_error(api, kernel, text, da, ra, other_text, db, rb):
    buf = stack_bytes(MSG_CAP)
    n = msg_begin(buf, kernel)
    n = msg_put(buf, MSG_CAP, n, text)
    n = msg_put_dims(buf, MSG_CAP, n, da, ra)
    n = msg_put(buf, MSG_CAP, n, other_text)
    n = msg_put_dims(buf, MSG_CAP, n, db, rb)
    # INVALID_ARGUMENT, as stock ORT's (Fused)Gemm reports a K mismatch at the default optimization
    # level, where it fuses MatMul+Add(+act) itself: the same exception type reaches Python
    return msg_status(api, ORT_INVALID_ARGUMENT, buf, n)


@njit(cache=True)
def gemm_io(api, ctx, kernel, dims):
    """Inputs and output of FusedGemmAct (and of its bf16 variant), checked: (status, x,
    w, b, y, M, K, N), with a one-sentence error status on any mismatch; y is allocated with X's
    leading dims and N. ``dims`` is GEMM_SCRATCH bytes of the caller's frame."""
    none = (0, 0, 0, 0, 0, 0, 0)
    st = check_input_count(api, ctx, kernel, 3)
    if st != 0:
        return (st, *none)
    dx = dims
    dw = dims + 8 * MAX_RANK
    dbb = dims + 16 * MAX_RANK
    dy = dims + 24 * MAX_RANK
    st, px, rx = read_float_input(api, ctx, kernel, 0, dx)
    if st != 0:
        return (st, *none)
    st, pw, rw = read_float_input(api, ctx, kernel, 1, dw)
    if st != 0:
        return (st, *none)
    st, pb, rb = read_float_input(api, ctx, kernel, 2, dbb)
    if st != 0:
        return (st, *none)
    if rx < 1:
        return (fail(api, kernel, _T_GEMM_X), *none)
    k = load_i64(dx + 8 * (rx - 1))
    if rw != 2 or load_i64(dw) != k:
        return (_gemm_shape_error(api, kernel, _T_GEMM_W, dx, rx, _T_W, dw, rw), *none)
    n = load_i64(dw + 8)
    if rb != 1 or load_i64(dbb) != n:
        return (_gemm_shape_error(api, kernel, _T_GEMM_B, dw, rw, _T_B, dbb, rb), *none)
    for i in range(rx - 1):
        store_i64(dy + 8 * i, load_i64(dx + 8 * i))
    store_i64(dy + 8 * (rx - 1), n)
    st, py = make_output(api, ctx, 0, dy, rx)
    return st, px, pw, pb, py, element_count(dx, rx - 1), k, n


def _compute_gemm_act(kernel, ctx):
    api = slot_api(kernel)
    dims = stack_bytes(GEMM_SCRATCH)
    st, px, pw, pb, py, m, k, n = gemm_io(api, ctx, kernel, dims)
    if st != 0 or m * n == 0:
        return st
    codes = stack_bytes(CODES_BYTES)
    steps = slot_i64(kernel, GA_ACT)
    for s in range(steps):
        store_i64(codes + 8 * s, slot_i64(kernel, GA_ACT + 1 + s))
    rpb = max(1, (m + GEMM_BLOCKS - 1) // GEMM_BLOCKS)
    args = stack_bytes(GEMM_ARGS_BYTES)
    store_i64(args + 8 * GA_SLOT, kernel)
    store_i64(args + 8 * GA_X, px)
    store_i64(args + 8 * GA_W, pw)
    store_i64(args + 8 * GA_B, pb)
    store_i64(args + 8 * GA_Y, py)
    store_i64(args + 8 * GA_M, m)
    store_i64(args + 8 * GA_K, k)
    store_i64(args + 8 * GA_N, n)
    store_i64(args + 8 * GA_RPB, rpb)
    store_i64(args + 8 * GA_CODES, codes)
    store_i64(args + 8 * GA_STEPS, steps)
    # work in "elementwise-equivalent" units: a multiply-add costs about 1/16 of a fused op element
    return run_blocks(api, ctx, kernel, args, (m + rpb - 1) // rpb, m * n * max(k, 1) // 16)


ACTIVATION_ATTR = AttrDef("activation", "choice", GA_ACT, required=False, choices=NATIVE_GEMM_EPILOGUES,
                          max_steps=GEMM_MAX_STEPS)
NATIVE_OPS = (NativeOpDef("FusedGemmAct", ("X", "W", "B"), _compute_gemm_act, _gemm_worker, attrs=(ACTIVATION_ATTR,)),)
