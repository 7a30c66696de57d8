"""``FusedDFL``: the distribution focal loss decode of a YOLOv8-style detect head, the expectation of
each softmax over R bins under the weights W (``ortfuse/fusion/rules/dfl.py``; docs/ARCHITECTURE.md §4).

Inputs, float32: X [B, G, R, A] (G box sides, R bins, A anchors: for each (b, g) the R bins of an
anchor lie A floats apart), W [R]. Output Y [B, 1, G, A]:

    Y[b, 0, g, a] = sum_r W[r] exp(X[b, g, r, a] - m) / sum_r exp(X[b, g, r, a] - m),  m = max_r X[b, g, r, a]

Any other rank or shape is an ORT error status naming what was expected.

A work block is one (b, g) and a span of anchors; it runs in chunks of CHUNK anchors whose running
maximum, sum of exponentials and weighted sum stay in stack buffers, each pass over the R rows of
the chunk a loop over contiguous anchors (one vector lane per anchor; vecmath's exponential).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from ortfuse.custom_ops.intrinsics import int_to_voidptr, load_i64, stack_bytes, store_i64
from ortfuse.custom_ops.native.elementwise import f32_view
from ortfuse.custom_ops.native.inputs import check_input_count, fail, make_output, read_float_input
from ortfuse.custom_ops.native.op_def import NativeOpDef
from ortfuse.custom_ops.native.slots import slot_api
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import DIMS_BYTES
from ortfuse.custom_ops.status_messages import cstr
from ortfuse.custom_ops.vecmath import exp_f32

OP = "FusedDFL"
CHUNK = 64  # anchors whose three running values sit in the stack buffer (3 * 64 floats)
SPAN = 512  # anchors per work block
# args block (int64 words)
DA_X, DA_W, DA_Y, DA_GROUPS, DA_BINS, DA_ANCHORS, DA_SPANS = range(7)
ARGS_BYTES = 8 * 7

_T_SHAPES = cstr("X must have rank 4 [batch, sides, bins, anchors] and W the shape [bins]")


@njit(nogil=True, error_model="numpy", cache=True)
def _dfl_tail(x, w, y, c0, n, top, tot, acc):
    """y[c0:c0 + n] (n < CHUNK) of one group: ``dfl_span``'s steps with a run-time trip count."""
    bins = w.shape[0]
    anchors = y.shape[0]
    row = x[c0:c0 + n]
    for i in range(n):
        top[i] = row[i]
        tot[i] = np.float32(0.0)
        acc[i] = np.float32(0.0)
    for k in range(1, bins):
        row = x[k * anchors + c0:k * anchors + c0 + n]
        for i in range(n):
            v = row[i]
            top[i] = v if v > top[i] else top[i]  # noqa: FURB136 - a select that keeps a NaN of top
    for k in range(bins):
        row = x[k * anchors + c0:k * anchors + c0 + n]
        wk = w[k]
        for i in range(n):
            e = exp_f32(row[i] - top[i])
            tot[i] += e
            acc[i] += e * wk
    out = y[c0:c0 + n]
    for i in range(n):
        out[i] = acc[i] / tot[i]


@njit(nogil=True, error_model="numpy", cache=True)
def dfl_span(x, w, y, a0, a1):
    """y[a] for anchors a0..a1 of one group: x its [R, A] values (flat), w [R], y its [A] outputs.
    Whole chunks run here with the constant trip count CHUNK (written out here, not through a
    helper taking the count as an argument, so that LLVM vectorizes them fully), the rest in
    ``_dfl_tail``."""
    bins = w.shape[0]
    anchors = y.shape[0]
    top = carray(int_to_voidptr(stack_bytes(256)), (CHUNK,), np.float32)  # 4 * CHUNK bytes each
    tot = carray(int_to_voidptr(stack_bytes(256)), (CHUNK,), np.float32)
    acc = carray(int_to_voidptr(stack_bytes(256)), (CHUNK,), np.float32)
    c0 = a0
    while c0 + CHUNK <= a1:
        row = x[c0:c0 + CHUNK]
        for i in range(CHUNK):
            top[i] = row[i]
            tot[i] = np.float32(0.0)
            acc[i] = np.float32(0.0)
        for k in range(1, bins):
            row = x[k * anchors + c0:k * anchors + c0 + CHUNK]
            for i in range(CHUNK):
                v = row[i]
                top[i] = v if v > top[i] else top[i]  # noqa: FURB136 - a select that keeps a NaN of top
        for k in range(bins):
            row = x[k * anchors + c0:k * anchors + c0 + CHUNK]
            wk = w[k]
            for i in range(CHUNK):
                e = exp_f32(row[i] - top[i])
                tot[i] += e
                acc[i] += e * wk
        out = y[c0:c0 + CHUNK]
        for i in range(CHUNK):
            out[i] = acc[i] / tot[i]
        c0 += CHUNK
    if c0 < a1:
        _dfl_tail(x, w, y, c0, a1 - c0, top, tot, acc)


def compute_dfl(kernel, ctx):
    """Check X [B, G, R, A] and W [R] (R >= 1); allocate Y [B, 1, G, A]; run blocks of (group, span)."""
    api = slot_api(kernel)
    st = check_input_count(api, ctx, kernel, 2)
    if st != 0:
        return st
    dx = stack_bytes(DIMS_BYTES)
    dw = stack_bytes(DIMS_BYTES)
    st, px, rx = read_float_input(api, ctx, kernel, 0, dx)
    if st != 0:
        return st
    st, pw, rw = read_float_input(api, ctx, kernel, 1, dw)
    if st != 0:
        return st
    if rx != 4 or rw != 1:
        return fail(api, kernel, _T_SHAPES)
    b = load_i64(dx)
    g = load_i64(dx + 8)
    bins = load_i64(dx + 16)
    anchors = load_i64(dx + 24)
    if load_i64(dw) != bins or bins < 1:
        return fail(api, kernel, _T_SHAPES)
    dy = stack_bytes(DIMS_BYTES)
    store_i64(dy, b)
    store_i64(dy + 8, 1)
    store_i64(dy + 16, g)
    store_i64(dy + 24, anchors)
    st, py = make_output(api, ctx, 0, dy, 4)
    if st != 0:
        return st
    groups = b * g
    if groups * anchors == 0:
        return 0
    spans = (anchors + SPAN - 1) // SPAN
    args = stack_bytes(ARGS_BYTES)
    store_i64(args + 8 * DA_X, px)
    store_i64(args + 8 * DA_W, pw)
    store_i64(args + 8 * DA_Y, py)
    store_i64(args + 8 * DA_GROUPS, groups)
    store_i64(args + 8 * DA_BINS, bins)
    store_i64(args + 8 * DA_ANCHORS, anchors)
    store_i64(args + 8 * DA_SPANS, spans)
    return run_blocks(api, ctx, kernel, args, groups * spans, groups * bins * anchors)


def _dfl_worker(args, block):
    bins = load_i64(args + 8 * DA_BINS)
    anchors = load_i64(args + 8 * DA_ANCHORS)
    spans = load_i64(args + 8 * DA_SPANS)
    grp = block // spans
    a0 = (block % spans) * SPAN
    x = f32_view(load_i64(args + 8 * DA_X) + 4 * grp * bins * anchors, bins * anchors)
    y = f32_view(load_i64(args + 8 * DA_Y) + 4 * grp * anchors, anchors)
    dfl_span(x, f32_view(load_i64(args + 8 * DA_W), bins), y, a0, min(anchors, a0 + SPAN))


NATIVE_OPS = (NativeOpDef(OP, ("X", "W"), compute_dfl, _dfl_worker),)
