"""``FusedSqueezeExciteBlocked`` / ``FusedSqueezeExciteAddBlocked``: a whole squeeze-and-excitation
block as one op on a tensor in ORT's NCHWc blocked layout, in place of ORT's blocked
GlobalAveragePool, two 1x1 Convs on a 1x1 image and the channel scale (docs/ARCHITECTURE.md §9).

Inputs, float32: X of logical shape [N, C, H, W] whose memory is [N, C / block, H, W, block] (as
ORT's blocked ops hold it; C is the padded channel count); W1 [C, Cr], the FC1 1x1 conv's weights
transposed (w1ᵀ); B1 [Cr]; W2 [Cr, C], FC2's weights transposed (w2ᵀ); B2 [C]; and for the Add
variant A, X's shape and layout. Attributes: ``block`` (1 to 64, dividing C), ``activation`` (FC1's:
absent none, ``relu``, ``hardswish`` (v * hardsigmoid(v, 1/6, 1/2)), ``silu``, ``sigmoid``),
``gate`` (``hardsigmoid`` with ``alpha``, ``beta``, default 0.2 and 0.5, or ``sigmoid``),
``residual`` (0 or 1). Output Y like X:

    m[n, c] = mean over (h, w) of X[n, c, h, w]           (summed in float64)
    z[n, r] = act(sum_c W1[c, r] m[n, c] + B1[r])
    s[n, c] = gate(sum_r W2[r, c] z[n, r] + B2[c])
    Y = X * s  [+ X if residual]  [+ A]                    (float32, in this order)

``custom_ops/kernels/squeeze_excite.reference`` is the numpy reference. Any other rank, shape or
block is an ORT error status naming what was expected; nothing is read or written outside the
tensors. Work: the channel means per group (one image and channel block: H * W * block contiguous
values) on the thread pool, the two small products serially (axpy rows, vectorized), then the scale
per group on the pool.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from ortfuse.custom_ops.intrinsics import (
    c_free,
    c_malloc,
    int_to_voidptr,
    load_f64,
    load_i64,
    stack_bytes,
    store_f64,
    store_i64,
)
from ortfuse.custom_ops.kernels.scalar import hardsigmoid1, relu1
from ortfuse.custom_ops.native.elementwise import BLOCK, f32_view
from ortfuse.custom_ops.native.inputs import check_input_count, fail, make_output, read_float_input
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.slots import slot_api, slot_f32, slot_i64
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import DIMS_BYTES, EXT, EXT_N_INPUTS, S_RECORD
from ortfuse.custom_ops.status_messages import cstr
from ortfuse.custom_ops.vecmath import sigmoid_f32, silu_f32

OP, OP_ADD = "FusedSqueezeExciteBlocked", "FusedSqueezeExciteAddBlocked"
ACTIVATIONS = ("relu", "hardswish", "silu", "sigmoid")
GATES = ("hardsigmoid", "sigmoid")
ACT_NONE, ACT_RELU, ACT_HARDSWISH, ACT_SILU, ACT_SIGMOID = range(5)
GATE_HARDSIGMOID, GATE_SIGMOID = 0, 1
SE_BLOCK, SE_ALPHA, SE_BETA, SE_RESIDUAL, SE_ACT, SE_GATE = 0, 1, 2, 3, 4, 6  # attribute words
ATTRS = (AttrDef("block", "int", SE_BLOCK),
         AttrDef("alpha", "float", SE_ALPHA, required=False, default=0.2),
         AttrDef("beta", "float", SE_BETA, required=False, default=0.5),
         AttrDef("residual", "int", SE_RESIDUAL, required=False, default=0),
         AttrDef("activation", "choice", SE_ACT, required=False, choices=ACTIVATIONS, max_steps=1),
         AttrDef("gate", "choice", SE_GATE, choices=GATES, max_steps=1))
MAX_BLOCK = 64
PATTERN = 64  # floats in a repeated row of one block's values (PATTERN % block == 0 for blocks 1..64 dividing it)
ROWS_F32 = 16  # rows of PATTERN values summed in float32 before they are added to the float64 sums
MIN_BLOCKS = 8  # blocks of groups wanted per phase where there are the groups (threads kept evenly busy)
PHASE_MEAN, PHASE_SCALE = 0, 1
# args block (int64 words)
(SA_X, SA_Y, SA_A, SA_MEAN, SA_GATE, SA_N, SA_GROUPS, SA_INNER, SA_LANES, SA_GPB, SA_PHASE, SA_RESIDUAL,
 SA_HAS_A, SA_INV_HW) = range(14)
ARGS_BYTES = 8 * 14

_T_SHAPES = cstr("X must have rank 4 [N, C, H, W], W1 the shape [C, Cr], B1 [Cr], W2 [Cr, C], B2 [C] "
                 "and A X's shape")
_T_BLOCK = cstr("the channels of X must be a multiple of the attribute block (1 to 64) and residual 0 or 1")
_T_MEMORY = cstr("could not allocate the channel means and gates")


@njit(nogil=True, error_model="numpy", cache=True)
def mean_groups(x, mean, g0, g1, inner, lanes, inv_hw):
    """mean[g * lanes + i] = inv_hw * sum_p x[g * inner + p * lanes + i] for groups g0..g1. Rows of
    PATTERN values are summed in float32 (ROWS_F32 at a time, a constant trip count LLVM vectorizes),
    then in float64."""
    acc = carray(int_to_voidptr(stack_bytes(512)), (PATTERN,), np.float64)  # 8 * PATTERN bytes
    part = carray(int_to_voidptr(stack_bytes(256)), (PATTERN,), np.float32)  # 4 * PATTERN bytes
    for g in range(g0, g1):
        xs = x[g * inner:(g + 1) * inner]
        for i in range(PATTERN):
            acc[i] = 0.0
        if PATTERN % lanes == 0:
            full = inner - inner % PATTERN
            p = 0
            while p < full:
                stop = min(full, p + PATTERN * ROWS_F32)
                for i in range(PATTERN):
                    part[i] = np.float32(0.0)
                for q in range(p, stop, PATTERN):
                    xq = xs[q:q + PATTERN]
                    for i in range(PATTERN):
                        part[i] += xq[i]
                for i in range(PATTERN):
                    acc[i] += part[i]
                p = stop
            for j in range(full, inner):  # full is a multiple of lanes: j - full has j's lane
                acc[j - full] += xs[j]
            for i in range(lanes):
                t = 0.0
                for k in range(i, PATTERN, lanes):
                    t += acc[k]
                mean[g * lanes + i] = np.float32(t * inv_hw)
        else:
            for p in range(0, inner, lanes):
                for i in range(lanes):
                    acc[i] += xs[p + i]
            for i in range(lanes):
                mean[g * lanes + i] = np.float32(acc[i] * inv_hw)


@njit(nogil=True, error_model="numpy", cache=True)
def excite(m, w1, b1, w2, b2, z, s, c, cr, act, gate, alpha, beta):
    """s[0:c] = gate(W2ᵀ act(W1ᵀ m + B1) + B2) for one image (module docstring), as axpy rows."""
    for r in range(cr):
        z[r] = b1[r]
    for k in range(c):
        mk = m[k]
        row = w1[k * cr:(k + 1) * cr]
        for r in range(cr):
            z[r] += mk * row[r]
    for r in range(cr):
        v = z[r]
        if act == ACT_RELU:
            v = relu1(v)
        elif act == ACT_HARDSWISH:
            v = v * hardsigmoid1(v, np.float32(1.0 / 6.0), np.float32(0.5))
        elif act == ACT_SILU:
            v = silu_f32(v)
        elif act == ACT_SIGMOID:
            v = sigmoid_f32(v)
        z[r] = v
    for k in range(c):
        s[k] = b2[k]
    for r in range(cr):
        zr = z[r]
        row = w2[r * c:(r + 1) * c]
        for k in range(c):
            s[k] += zr * row[k]
    for k in range(c):
        if gate == GATE_SIGMOID:
            s[k] = sigmoid_f32(s[k])
        else:
            s[k] = hardsigmoid1(s[k], alpha, beta)


@njit(nogil=True, error_model="numpy", cache=True)
def scale_groups(x, s, a, y, g0, g1, inner, lanes, residual, has_a):
    """Y = X * s [+ X] [+ A] for groups g0..g1 (as ``channel_scale.scale_groups``: where ``lanes``
    divides PATTERN, the block's gates repeated into a PATTERN-long row, one loop of constant trip
    count per form, which LLVM turns into whole-vector operations)."""
    pat = carray(int_to_voidptr(stack_bytes(256)), (PATTERN,), np.float32)  # 4 * PATTERN bytes
    form = (1 if residual else 0) + (2 if has_a else 0)
    for g in range(g0, g1):
        base = g * inner
        xs = x[base:base + inner]
        ys = y[base:base + inner]
        as_ = a[base:base + inner]
        full = 0
        if PATTERN % lanes == 0:
            for i in range(PATTERN):
                pat[i] = s[g * lanes + i % lanes]
            full = inner - inner % PATTERN
            if form == 0:
                for p in range(0, full, PATTERN):
                    xp = xs[p:p + PATTERN]
                    yp = ys[p:p + PATTERN]
                    for i in range(PATTERN):
                        yp[i] = xp[i] * pat[i]
            elif form == 1:
                for p in range(0, full, PATTERN):
                    xp = xs[p:p + PATTERN]
                    yp = ys[p:p + PATTERN]
                    for i in range(PATTERN):
                        yp[i] = xp[i] * pat[i] + xp[i]
            elif form == 2:
                for p in range(0, full, PATTERN):
                    xp = xs[p:p + PATTERN]
                    yp = ys[p:p + PATTERN]
                    ap = as_[p:p + PATTERN]
                    for i in range(PATTERN):
                        yp[i] = xp[i] * pat[i] + ap[i]
            else:
                for p in range(0, full, PATTERN):
                    xp = xs[p:p + PATTERN]
                    yp = ys[p:p + PATTERN]
                    ap = as_[p:p + PATTERN]
                    for i in range(PATTERN):
                        yp[i] = (xp[i] * pat[i] + xp[i]) + ap[i]
        else:
            for i in range(lanes):
                pat[i] = s[g * lanes + i]
        for j in range(full, inner):  # full is a multiple of lanes: (j - full) % lanes is j's lane
            v = xs[j] * pat[(j - full) % lanes]
            if residual:
                v = v + xs[j]
            if has_a:
                v = v + as_[j]
            ys[j] = v


def compute_squeeze_excite(kernel, ctx):
    """Check the inputs and attributes; allocate Y and the means and gates; run the three phases."""
    api = slot_api(kernel)
    nin = load_i64(load_i64(kernel + 8 * S_RECORD) + EXT + 8 * EXT_N_INPUTS)
    st = check_input_count(api, ctx, kernel, nin)
    if st != 0:
        return st
    dx = stack_bytes(DIMS_BYTES)
    dw1 = stack_bytes(DIMS_BYTES)
    db1 = stack_bytes(DIMS_BYTES)
    dw2 = stack_bytes(DIMS_BYTES)
    db2 = stack_bytes(DIMS_BYTES)
    da = stack_bytes(DIMS_BYTES)
    st, px, rx = read_float_input(api, ctx, kernel, 0, dx)
    if st != 0:
        return st
    st, pw1, rw1 = read_float_input(api, ctx, kernel, 1, dw1)
    if st != 0:
        return st
    st, pb1, rb1 = read_float_input(api, ctx, kernel, 2, db1)
    if st != 0:
        return st
    st, pw2, rw2 = read_float_input(api, ctx, kernel, 3, dw2)
    if st != 0:
        return st
    st, pb2, rb2 = read_float_input(api, ctx, kernel, 4, db2)
    if st != 0:
        return st
    pa, ra = px, 4
    if nin == 6:
        st, pa, ra = read_float_input(api, ctx, kernel, 5, da)
        if st != 0:
            return st
    else:
        for i in range(4):
            store_i64(da + 8 * i, load_i64(dx + 8 * i))
    if rx != 4 or rw1 != 2 or rb1 != 1 or rw2 != 2 or rb2 != 1 or ra != 4:
        return fail(api, kernel, _T_SHAPES)
    n0 = load_i64(dx)
    c = load_i64(dx + 8)
    hw = load_i64(dx + 16) * load_i64(dx + 24)
    cr = load_i64(dw1 + 8)
    if load_i64(dw1) != c or load_i64(db1) != cr or load_i64(dw2) != cr or load_i64(dw2 + 8) != c \
            or load_i64(db2) != c:
        return fail(api, kernel, _T_SHAPES)
    for i in range(4):
        if load_i64(da + 8 * i) != load_i64(dx + 8 * i):
            return fail(api, kernel, _T_SHAPES)
    lanes = slot_i64(kernel, SE_BLOCK)
    residual = slot_i64(kernel, SE_RESIDUAL)
    if lanes < 1 or lanes > MAX_BLOCK or c % lanes != 0 or (residual != 0 and residual != 1):
        return fail(api, kernel, _T_BLOCK)
    st, py = make_output(api, ctx, 0, dx, 4)
    if st != 0:
        return st
    n = n0 * c * hw
    if n == 0:
        return 0
    scratch = c_malloc(4 * (2 * n0 * c + cr + 1))
    if scratch == 0:
        return fail(api, kernel, _T_MEMORY)
    pmean = scratch
    pgate = scratch + 4 * n0 * c
    pz = pgate + 4 * n0 * c
    inner = hw * lanes
    groups = n0 * (c // lanes)
    gpb = max(1, min(BLOCK // inner, groups // MIN_BLOCKS))
    args = stack_bytes(ARGS_BYTES)
    for word, value in ((SA_X, px), (SA_Y, py), (SA_A, pa), (SA_MEAN, pmean), (SA_GATE, pgate), (SA_N, n),
                        (SA_GROUPS, groups), (SA_INNER, inner), (SA_LANES, lanes), (SA_GPB, gpb),
                        (SA_PHASE, PHASE_MEAN), (SA_RESIDUAL, residual), (SA_HAS_A, 1 if nin == 6 else 0)):
        store_i64(args + 8 * word, value)
    store_f64(args + 8 * SA_INV_HW, 1.0 / hw)
    nblocks = (groups + gpb - 1) // gpb
    st = run_blocks(api, ctx, kernel, args, nblocks, n)
    if st == 0:
        act = slot_i64(kernel, SE_ACT + 1) + 1 if slot_i64(kernel, SE_ACT) > 0 else ACT_NONE
        gate = slot_i64(kernel, SE_GATE + 1)
        alpha = slot_f32(kernel, SE_ALPHA)
        beta = slot_f32(kernel, SE_BETA)
        w1 = f32_view(pw1, c * cr)
        w2 = f32_view(pw2, cr * c)
        b1 = f32_view(pb1, cr)
        b2 = f32_view(pb2, c)
        z = f32_view(pz, cr + 1)
        for image in range(n0):
            excite(f32_view(pmean + 4 * image * c, c), w1, b1, w2, b2, z, f32_view(pgate + 4 * image * c, c), c, cr,
                   act, gate, alpha, beta)
        store_i64(args + 8 * SA_PHASE, PHASE_SCALE)
        st = run_blocks(api, ctx, kernel, args, nblocks, n)
    c_free(scratch)
    return st


def _squeeze_excite_worker(args, block):
    n = load_i64(args + 8 * SA_N)
    groups = load_i64(args + 8 * SA_GROUPS)
    inner = load_i64(args + 8 * SA_INNER)
    lanes = load_i64(args + 8 * SA_LANES)
    gpb = load_i64(args + 8 * SA_GPB)
    g0 = block * gpb
    g1 = min(groups, g0 + gpb)
    x = f32_view(load_i64(args + 8 * SA_X), n)
    gates = groups * lanes
    if load_i64(args + 8 * SA_PHASE) == PHASE_MEAN:
        mean_groups(x, f32_view(load_i64(args + 8 * SA_MEAN), gates), g0, g1, inner, lanes,
                    load_f64(args + 8 * SA_INV_HW))
    else:
        scale_groups(x, f32_view(load_i64(args + 8 * SA_GATE), gates), f32_view(load_i64(args + 8 * SA_A), n),
                     f32_view(load_i64(args + 8 * SA_Y), n), g0, g1, inner, lanes,
                     load_i64(args + 8 * SA_RESIDUAL) != 0, load_i64(args + 8 * SA_HAS_A) != 0)


NATIVE_OPS = (NativeOpDef(OP, ("X", "W1", "B1", "W2", "B2"), compute_squeeze_excite, _squeeze_excite_worker,
                          attrs=ATTRS),
              NativeOpDef(OP_ADD, ("X", "W1", "B1", "W2", "B2", "A"), compute_squeeze_excite,
                          _squeeze_excite_worker, attrs=ATTRS))
