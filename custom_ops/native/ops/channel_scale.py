"""``FusedChannelScaleBlocked``: the squeeze-and-excitation scale ``x * s`` (s one value per image and
channel) on tensors in ORT's NCHWc blocked layout, so that the Mul stays between ORT's blocked
convolutions instead of being wrapped in a ReorderOutput ... ReorderInput pair (ORT's NCHWc
transformer blocks Mul only for equal shapes; docs/ARCHITECTURE.md §9).

Inputs, float32, as ORT's blocked ops hold them: X of logical shape [N, Cp, H, W] whose memory is
[N, Cp / block, H, W, block]; S of shape [N, Cp, 1, 1] (memory [N, Cp]: channel c at c). Attribute
``block``: the NCHWc block size of the graph (Cp a multiple of it). Output Y like X:

    Y[n, g, h, w, i] = X[n, g, h, w, i] * S[n, g * block + i]

Any other rank or shape is an ORT error status naming what was expected.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from ortfuse.custom_ops.intrinsics import int_to_voidptr, load_i64, stack_bytes, store_i64
from ortfuse.custom_ops.native.elementwise import BLOCK, f32_view
from ortfuse.custom_ops.native.inputs import check_input_count, fail, make_output, read_float_input
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.slots import slot_api, slot_i64
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import DIMS_BYTES
from ortfuse.custom_ops.status_messages import cstr

CS_BLOCK = 0  # attribute word
ATTRS = (AttrDef("block", "int", CS_BLOCK),)
# args block (int64 words)
CA_SLOT, CA_X, CA_S, CA_Y, CA_N, CA_GROUPS, CA_INNER, CA_BLOCK, CA_GPB = range(9)
ARGS_BYTES = 8 * 9
MAX_BLOCK = 64
PATTERN = 64  # floats in the repeated scale row

_T_SHAPES = cstr("X must have rank 4 and S the shape [N, C, 1, 1] of X's first two dims")
_T_BLOCK = cstr("the channels of X must be a multiple of the attribute block (1 to 64)")


@njit(nogil=True, error_model="numpy", cache=True)
def scale_groups(x, s, y, g0, g1, inner, block):
    """Groups g0..g1 (one image and channel block each: ``inner`` = H * W * block elements). Where
    ``block`` divides PATTERN, the block's scales are repeated into a PATTERN-long row and each row
    of X multiplies it: a constant trip count that LLVM turns into whole-vector multiplies."""
    pat = carray(int_to_voidptr(stack_bytes(256)), (PATTERN,), np.float32)  # 4 * PATTERN bytes
    for g in range(g0, g1):
        base = g * inner
        xs = x[base:base + inner]
        ys = y[base:base + inner]
        if PATTERN % block == 0:
            for i in range(PATTERN):
                pat[i] = s[g * block + i % block]
            full = inner - inner % PATTERN
            for p in range(0, full, PATTERN):
                xp = xs[p:p + PATTERN]
                yp = ys[p:p + PATTERN]
                for i in range(PATTERN):
                    yp[i] = xp[i] * pat[i]
            for j in range(full, inner):
                ys[j] = xs[j] * pat[j - full]
        else:
            sb = s[g * block:(g + 1) * block]
            for p in range(0, inner, block):
                for i in range(block):
                    ys[p + i] = xs[p + i] * sb[i]


def compute_channel_scale(kernel, ctx):
    """Check X [N, C, H, W], S [N, C, 1, 1], C % block == 0; allocate Y; run blocks of groups."""
    api = slot_api(kernel)
    st = check_input_count(api, ctx, kernel, 2)
    if st != 0:
        return st
    dx = stack_bytes(DIMS_BYTES)
    ds = stack_bytes(DIMS_BYTES)
    st, px, rx = read_float_input(api, ctx, kernel, 0, dx)
    if st != 0:
        return st
    st, ps, rs = read_float_input(api, ctx, kernel, 1, ds)
    if st != 0:
        return st
    if rx != 4 or rs != 4:
        return fail(api, kernel, _T_SHAPES)
    n0 = load_i64(dx)
    c = load_i64(dx + 8)
    hw = load_i64(dx + 16) * load_i64(dx + 24)
    if load_i64(ds) != n0 or load_i64(ds + 8) != c or load_i64(ds + 16) != 1 or load_i64(ds + 24) != 1:
        return fail(api, kernel, _T_SHAPES)
    block = slot_i64(kernel, CS_BLOCK)
    if block < 1 or block > MAX_BLOCK or c % block != 0:
        return fail(api, kernel, _T_BLOCK)
    st, py = make_output(api, ctx, 0, dx, 4)
    if st != 0:
        return st
    n = n0 * c * hw
    if n == 0:
        return 0
    inner = hw * block
    groups = n0 * (c // block)
    gpb = max(1, BLOCK // inner)
    args = stack_bytes(ARGS_BYTES)
    store_i64(args + 8 * CA_SLOT, kernel)
    store_i64(args + 8 * CA_X, px)
    store_i64(args + 8 * CA_S, ps)
    store_i64(args + 8 * CA_Y, py)
    store_i64(args + 8 * CA_N, n)
    store_i64(args + 8 * CA_GROUPS, groups)
    store_i64(args + 8 * CA_INNER, inner)
    store_i64(args + 8 * CA_BLOCK, block)
    store_i64(args + 8 * CA_GPB, gpb)
    return run_blocks(api, ctx, kernel, args, (groups + gpb - 1) // gpb, n)


def _channel_scale_worker(args, block):
    n = load_i64(args + 8 * CA_N)
    groups = load_i64(args + 8 * CA_GROUPS)
    inner = load_i64(args + 8 * CA_INNER)
    lanes = load_i64(args + 8 * CA_BLOCK)
    gpb = load_i64(args + 8 * CA_GPB)
    g0 = block * gpb
    scale_groups(f32_view(load_i64(args + 8 * CA_X), n), f32_view(load_i64(args + 8 * CA_S), groups * lanes),
                 f32_view(load_i64(args + 8 * CA_Y), n), g0, min(groups, g0 + gpb), inner, lanes)


NATIVE_OPS = (NativeOpDef("FusedChannelScaleBlocked", ("X", "S"), compute_channel_scale, _channel_scale_worker,
                          attrs=ATTRS),)
