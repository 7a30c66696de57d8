"""``FusedPointwiseConvBlocked``: a 1x1, stride-1 convolution (group 1, no padding) with its bias and
an elementwise epilogue, on tensors in ORT's NCHWc blocked layout (docs/ARCHITECTURE.md §9): the
epilogue ORT runs as a pass of its own after its blocked Conv (QuickGelu, which ORT makes of
Conv -> Sigmoid -> Mul) applied to each tile of outputs while it is in cache.
``FusedPointwiseConcatConvBlocked{K}`` (K = 2..MAX_INPUTS): the same conv of the channel
concatenation of K inputs, read where they are, so that the Concat before it is not a copy.

Inputs, float32: X (or X0..X{K-1}) of logical shape [N, Cin, H, W] whose memory is [N, Cin / block,
H, W, block] (as ORT's blocked ops hold it; every X of one N, H and W); P [Cout, Cin], the filter
of the concatenation (Cin the sum of the Xs' channels) packed by ``kernels.pointwise_ref.pack_filter``
(made once when the graph is planned); B [Cout]. Attributes: ``block`` (8 or 16, the NCHWc block;
every Cin and Cout multiples of it), ``activation`` (absent: none; ``relu``; ``quick_gelu``: v *
sigmoid(alpha * v)), ``alpha`` (default 1). Output Y [N, Cout, H, W], blocked like X:

    Y = act(conv1x1(concat(X0, .., X{K-1}), w) + B)

Any other rank, shape or block is an ORT error status naming what was expected.

Work is split into blocks of consecutive positions of one image (tiles of ``tile_rows`` positions)
and, when an image has fewer tiles than ``TARGET_BLOCKS``, of panels of output blocks too; each
block computes its tiles panel by panel with the register-blocked ``kernels.pointwise.pw_tile``
(one call per input, each adding its channels' products to the last's sums) and applies the
epilogue to each tile's rows before the next.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.intrinsics import load_f64, load_i64, stack_bytes, store_f64, store_i64
from ortfuse.custom_ops.kernels.pointwise import pw_tile
from ortfuse.custom_ops.kernels.pointwise_ref import PANEL
from ortfuse.custom_ops.native.elementwise import f32_view
from ortfuse.custom_ops.native.inputs import check_input_count, fail, make_output, read_float_input
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.ops.winograd_conv import ACT_NONE, ACTIVATIONS, epilogue_rows
from ortfuse.custom_ops.native.slots import slot_api, slot_f32, slot_i64
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import DIMS_BYTES
from ortfuse.custom_ops.ort_api import context_input_count
from ortfuse.custom_ops.status_messages import cstr

OP = "FusedPointwiseConvBlocked"
CONCAT_OP = "FusedPointwiseConcatConvBlocked"  # + K, the number of inputs
MAX_INPUTS = 6
PA_BLOCK, PA_ALPHA, PA_ACT = 0, 1, 2  # attribute words (activation: count, index)
ATTRS = (AttrDef("block", "int", PA_BLOCK), AttrDef("alpha", "float", PA_ALPHA, required=False, default=1.0),
         AttrDef("activation", "choice", PA_ACT, required=False, choices=ACTIVATIONS, max_steps=1))
# positions per pw_tile call: with 16 lanes (32 vector registers) 14 x 2 accumulators, the 2 filter
# vectors and the broadcast; with 8 lanes (16 registers) 6 x 2; the rest of a chunk in calls of
# TAIL_ROWS, then of 1
ROWS_512, ROWS_256, TAIL_512, TAIL_256 = 14, 6, 4, 2
TARGET_BLOCKS = 16  # work blocks wanted per image: panels are split too where the tiles are fewer
# args block (int64 words)
(PW_SLOT, PW_P, PW_B, PW_Y, PW_CIN, PW_COUT, PW_HW, PW_LANES, PW_CHUNK, PW_CHUNKS, PW_PANELS_PER,
 PW_SPLIT, PW_ACT, PW_ALPHA, PW_NX, PW_XS) = range(16)  # PW_XS: per input, its address and channels
ARGS_BYTES = 8 * (PW_XS + 2 * MAX_INPUTS)

_T_SHAPES = cstr("X must have rank 4 (every input X the batch, height and width of the first), P the shape "
                 "[Cout, Cin] with Cin = X's channels (their sum), and B the shape [Cout]")
_T_BLOCK = cstr("the attribute block must be 8 or 16 and divide every channel count")


@njit(nogil=True, error_model="numpy", cache=True)
def tile_rows(lanes):
    return ROWS_512 if lanes == 16 else ROWS_256


@njit(nogil=True, error_model="numpy", cache=True)
def _tile(xa, xbs, pa, ba, ya, cib, acc, rows, vecs, lanes):
    """pw_tile with its constants: ``rows`` tile_rows(lanes), the tail rows or 1; ``vecs`` 1 or 2."""
    if lanes == 16:
        if vecs == 2:
            if rows == ROWS_512:
                pw_tile(xa, xbs, pa, ba, ya, xbs, cib, acc, ROWS_512, 2, 16)
            elif rows == TAIL_512:
                pw_tile(xa, xbs, pa, ba, ya, xbs, cib, acc, TAIL_512, 2, 16)
            else:
                pw_tile(xa, xbs, pa, ba, ya, xbs, cib, acc, 1, 2, 16)
        elif rows == ROWS_512:
            pw_tile(xa, xbs, pa, ba, ya, xbs, cib, acc, ROWS_512, 1, 16)
        elif rows == TAIL_512:
            pw_tile(xa, xbs, pa, ba, ya, xbs, cib, acc, TAIL_512, 1, 16)
        else:
            pw_tile(xa, xbs, pa, ba, ya, xbs, cib, acc, 1, 1, 16)
    elif vecs == 2:
        if rows == ROWS_256:
            pw_tile(xa, xbs, pa, ba, ya, xbs, cib, acc, ROWS_256, 2, 8)
        elif rows == TAIL_256:
            pw_tile(xa, xbs, pa, ba, ya, xbs, cib, acc, TAIL_256, 2, 8)
        else:
            pw_tile(xa, xbs, pa, ba, ya, xbs, cib, acc, 1, 2, 8)
    elif rows == ROWS_256:
        pw_tile(xa, xbs, pa, ba, ya, xbs, cib, acc, ROWS_256, 1, 8)
    elif rows == TAIL_256:
        pw_tile(xa, xbs, pa, ba, ya, xbs, cib, acc, TAIL_256, 1, 8)
    else:
        pw_tile(xa, xbs, pa, ba, ya, xbs, cib, acc, 1, 1, 8)


@njit(nogil=True, error_model="numpy", cache=True)
def pointwise_positions(xs, nx, image, pa, ba, ya, hw, cin, cout, p0, p1, q0, q1, lanes, act, alpha):
    """Positions p0..p1 of image ``image`` (ya: that image's Y), panels q0..q1 of PANEL output
    blocks: each panel's tiles in order, every input's channels added in turn (``xs``: ``nx`` pairs
    of words, an input's address and channels), the epilogue on each tile's rows after them."""
    nob = cout // lanes
    xbs = hw * lanes
    full = tile_rows(lanes)
    tail = TAIL_512 if lanes == 16 else TAIL_256
    for q in range(q0, q1):
        ob = q * PANEL
        vecs = min(PANEL, nob - ob)
        panel = pa + 4 * ob * lanes * cin
        bias = ba + 4 * ob * lanes
        p = p0
        while p < p1:
            left = p1 - p
            rows = full if left >= full else (tail if left >= tail else 1)
            dst = ya + 4 * (ob * xbs + p * lanes)
            first = 0
            for k in range(nx):
                ck = load_i64(xs + 16 * k + 8)
                xa = load_i64(xs + 16 * k) + 4 * image * ck * hw
                _tile(xa + 4 * p * lanes, xbs, panel + 4 * first * vecs * lanes, bias, dst, ck // lanes, k, rows,
                      vecs, lanes)
                first += ck
            if act != ACT_NONE:
                for v in range(vecs):
                    epilogue_rows(f32_view(ya + 4 * ((ob + v) * xbs + p * lanes), rows * lanes), act, alpha)
            p += rows


@njit(cache=True)
def _compute(kernel, ctx):
    """Check X0..X{K-1} [N, Ci, H, W], P [Cout, sum Ci], B [Cout] and the block; allocate Y; run the
    blocks. K is the node's input count less two (P and B come last)."""
    api = slot_api(kernel)
    tmp = stack_bytes(16)
    st = context_input_count(api, ctx, tmp)
    if st != 0:
        return st
    nx = load_i64(tmp) - 2
    if nx < 1 or nx > MAX_INPUTS:
        return check_input_count(api, ctx, kernel, 3)
    dx = stack_bytes(DIMS_BYTES)
    d0 = stack_bytes(DIMS_BYTES)
    dp = stack_bytes(DIMS_BYTES)
    db = stack_bytes(DIMS_BYTES)
    args = stack_bytes(ARGS_BYTES)
    lanes = slot_i64(kernel, PA_BLOCK)
    cin = 0
    for k in range(nx):
        st, px, rx = read_float_input(api, ctx, kernel, k, dx if k else d0)
        if st != 0:
            return st
        if rx != 4:
            return fail(api, kernel, _T_SHAPES)
        if k and (load_i64(dx) != load_i64(d0) or load_i64(dx + 16) != load_i64(d0 + 16)
                  or load_i64(dx + 24) != load_i64(d0 + 24)):
            return fail(api, kernel, _T_SHAPES)
        ck = load_i64((dx if k else d0) + 8)
        if (lanes != 8 and lanes != 16) or ck % lanes != 0 or ck == 0:
            return fail(api, kernel, _T_BLOCK)
        store_i64(args + 8 * (PW_XS + 2 * k), px)
        store_i64(args + 8 * (PW_XS + 2 * k + 1), ck)
        cin += ck
    st, pp, rp = read_float_input(api, ctx, kernel, nx, dp)
    if st != 0:
        return st
    st, pb, rb = read_float_input(api, ctx, kernel, nx + 1, db)
    if st != 0:
        return st
    if rp != 2 or rb != 1:
        return fail(api, kernel, _T_SHAPES)
    n = load_i64(d0)
    hw = load_i64(d0 + 16) * load_i64(d0 + 24)
    cout = load_i64(dp)
    if load_i64(dp + 8) != cin or load_i64(db) != cout:
        return fail(api, kernel, _T_SHAPES)
    if cout % lanes != 0 or cout == 0:
        return fail(api, kernel, _T_BLOCK)
    store_i64(d0 + 8, cout)
    st, py = make_output(api, ctx, 0, d0, 4)
    if st != 0 or n * hw == 0:
        return st
    act = slot_i64(kernel, PA_ACT + 1) + 1 if slot_i64(kernel, PA_ACT) > 0 else ACT_NONE
    rows = tile_rows(lanes)
    tiles = (hw + rows - 1) // rows
    chunks = min(tiles, TARGET_BLOCKS)
    chunk = (tiles + chunks - 1) // chunks * rows
    chunks = (hw + chunk - 1) // chunk
    panels = (cout // lanes + PANEL - 1) // PANEL
    split = min(panels, (TARGET_BLOCKS + chunks - 1) // chunks)
    per = (panels + split - 1) // split
    split = (panels + per - 1) // per
    for word, value in ((PW_SLOT, kernel), (PW_P, pp), (PW_B, pb), (PW_Y, py), (PW_CIN, cin), (PW_COUT, cout),
                        (PW_HW, hw), (PW_LANES, lanes), (PW_CHUNK, chunk), (PW_CHUNKS, chunks),
                        (PW_PANELS_PER, per), (PW_SPLIT, split), (PW_ACT, act), (PW_NX, nx)):
        store_i64(args + 8 * word, value)
    store_f64(args + 8 * PW_ALPHA, np.float64(slot_f32(kernel, PA_ALPHA)))
    # cost in elementwise-equivalent units: multiply-adds / 16
    return run_blocks(api, ctx, kernel, args, n * chunks * split, n * hw * cin * cout // 16)


def compute_pointwise_conv(kernel, ctx):
    """FusedPointwiseConvBlocked: X, P, B; FusedPointwiseConcatConvBlocked{K}: X0..X{K-1}, P, B."""
    return _compute(kernel, ctx)


def _pointwise_worker(args, block):
    cout = load_i64(args + 8 * PW_COUT)
    hw = load_i64(args + 8 * PW_HW)
    chunk = load_i64(args + 8 * PW_CHUNK)
    chunks = load_i64(args + 8 * PW_CHUNKS)
    per = load_i64(args + 8 * PW_PANELS_PER)
    split = load_i64(args + 8 * PW_SPLIT)
    lanes = load_i64(args + 8 * PW_LANES)
    panels = (cout // lanes + PANEL - 1) // PANEL
    q0 = (block % split) * per
    p0 = ((block // split) % chunks) * chunk
    image = block // (split * chunks)
    pointwise_positions(args + 8 * PW_XS, load_i64(args + 8 * PW_NX), image, load_i64(args + 8 * PW_P),
                        load_i64(args + 8 * PW_B), load_i64(args + 8 * PW_Y) + 4 * image * cout * hw, hw,
                        load_i64(args + 8 * PW_CIN), cout, p0, min(hw, p0 + chunk), q0, min(panels, q0 + per), lanes,
                        load_i64(args + 8 * PW_ACT), np.float32(load_f64(args + 8 * PW_ALPHA)))


NATIVE_OPS = (NativeOpDef(OP, ("X", "P", "B"), compute_pointwise_conv, _pointwise_worker, attrs=ATTRS),) + tuple(
    NativeOpDef(f"{CONCAT_OP}{k}", tuple(f"X{i}" for i in range(k)) + ("P", "B"), compute_pointwise_conv,
                _pointwise_worker, attrs=ATTRS)
    for k in range(2, MAX_INPUTS + 1))
