"""``FusedDepthwiseConvBlocked``: a depthwise convolution (group = C, one K x K filter per channel, K
3 or 5, horizontal stride 1 or 2, any vertical stride, pads below K, no dilation) with its bias and
an elementwise epilogue, on tensors in ORT's NCHWc blocked layout (``custom_ops/kernels/depthwise.py``;
docs/ARCHITECTURE.md §9).

Inputs, float32: X of logical shape [N, C, H, W] whose memory is [N, C / block, H, W, block] (as ORT's
blocked ops hold it); F of logical shape [C, 1, K, K] whose memory is [C / block, K, K, block] (the
taps of a block's channels side by side, ``depthwise_ref.pack_filter``: ORT's own blocked depthwise
filter); B [C]. Attributes:
``block`` (8 or 16, the NCHWc block; C a multiple of it), ``strides`` [sh, sw], ``pads`` [top, left,
bottom, right], ``activation`` (absent: none; ``relu``; ``clip``: min(max(v, alpha), beta);
``hard_sigmoid``: clip(alpha v + beta, 0, 1); ``hard_swish``: v * clip(alpha v + beta, 0, 1);
``quick_gelu``: v * sigmoid(alpha v), SiLU at alpha 1; ``sigmoid``), ``alpha``, ``beta`` (floats,
default 1 and 0), ``in_scale``, ``in_shift`` (floats, default 1 and 0: an affine prologue on X, the
scalar Mul and Add a blocked region leaves before the conv), ``out_scale``, ``out_shift``
(floats, default 1 and 0: an affine map after the epilogue, the scalar Mul and Add after it).
Output Y [N, C, OH, OW], blocked like X, OH = (H + top + bottom - K) // sh + 1 and OW likewise:

    Y[n, c, oy, ox] = out_scale * act(B[c] + sum_{ky, kx < K} F[c, 0, ky, kx] * X'[n, c, oy*sh - top + ky,
                                                                                   ox*sw - left + kx]) + out_shift

with X' = in_scale * X + in_shift inside the image and zero outside (the padding is of X', as when
the affine is a node of its own before the conv). Any other rank, shape, block, stride or pad is an
ORT error status naming what was expected; nothing is read or written outside the tensors.

Work is split into blocks of output rows of one image and one channel block (``TARGET_BLOCKS`` per
run, rows permitting). Every output is computed by the register-blocked ``dw_row``
(``rows_per_call`` outputs per call, the last call of a row overlapping the previous one): the
outputs whose taps all fall inside the image read X in place, those at the left and right borders
read zero-padded strips of the block's input rows, copied once per block (a narrow image at stride 1:
one strip of whole padded rows, ``split_columns``). Relu, Clip, HardSigmoid and HardSwish are
applied in registers before the store; QuickGelu and Sigmoid (exp) to each output row while it is in
cache. The prologue costs no pass over X: the in-place outputs use the filter times in_scale and
the bias B + in_shift * (the sum of the taps on rows inside the image), per output row; the strips
hold X' itself, written while they are copied. ``fill_strip`` and the epilogue loops are plain
numba loops; nothing allocates but the one scratch buffer per block (``c_malloc``; a failure is an
ORT error status).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.intrinsics import (
    c_free,
    c_malloc,
    load_f64,
    load_i64,
    stack_bytes,
    store_f32,
    store_f64,
    store_i64,
)
from ortfuse.custom_ops.kernels.depthwise import dw_row
from ortfuse.custom_ops.kernels.scalar import ONE, ZERO
from ortfuse.custom_ops.native.elementwise import copy_f32, f32_view
from ortfuse.custom_ops.native.inputs import check_input_count, fail, make_output, read_float_input
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.slots import slot_api, slot_f32, slot_i64
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import DIMS_BYTES
from ortfuse.custom_ops.status_messages import cstr
from ortfuse.custom_ops.vecmath import sigmoid_f32, silu_f32

OP = "FusedDepthwiseConvBlocked"
ACTIVATIONS = ("relu", "clip", "hard_sigmoid", "hard_swish", "quick_gelu", "sigmoid")
ACT_NONE, ACT_RELU, ACT_CLIP, ACT_HARD_SIGMOID, ACT_HARD_SWISH, ACT_QUICK_GELU, ACT_SIGMOID = range(7)
ROW_PASS_ACTS = (ACT_QUICK_GELU, ACT_SIGMOID)  # need exp: applied to each row after dw_row, with the output map
KERNELS = (3, 5)
# attribute words: block; strides (count, 2 values); pads (count, 4 values); activation (count, index);
# alpha; beta; in_scale; in_shift; out_scale; out_shift
(DA_BLOCK, DA_STRIDES, DA_PADS, DA_ACT, DA_ALPHA, DA_BETA, DA_IN_SCALE, DA_IN_SHIFT, DA_OUT_SCALE,
 DA_OUT_SHIFT) = 0, 1, 4, 9, 11, 12, 13, 14, 15, 16
ATTRS = (AttrDef("block", "int", DA_BLOCK), AttrDef("strides", "ints", DA_STRIDES, max_steps=2),
         AttrDef("pads", "ints", DA_PADS, max_steps=4),
         AttrDef("activation", "choice", DA_ACT, required=False, choices=ACTIVATIONS, max_steps=1),
         AttrDef("alpha", "float", DA_ALPHA, required=False, default=1.0),
         AttrDef("beta", "float", DA_BETA, required=False, default=0.0),
         AttrDef("in_scale", "float", DA_IN_SCALE, required=False, default=1.0),
         AttrDef("in_shift", "float", DA_IN_SHIFT, required=False, default=0.0),
         AttrDef("out_scale", "float", DA_OUT_SCALE, required=False, default=1.0),
         AttrDef("out_shift", "float", DA_OUT_SHIFT, required=False, default=0.0))
ROWS = 8  # outputs per register-blocked call with 8 lanes (16 vector registers), K 3 stride 1
ROWS_WIDE = 4  # with 8 lanes, K 5 or stride 2
ROWS_512 = 12  # with 16 lanes (32 vector registers), any K and stride
MIN_CALLS = 4  # fewer register-blocked calls per row in place: the whole row from a padded strip
SCRATCH_FLOATS = 32 * 1024  # strips of input rows per block: 128 KB, within a core's L2
TARGET_BLOCKS = 16  # blocks of rows wanted per run (enough to balance a few threads), rows permitting
# args block (int64 words)
(DG_X, DG_F, DG_B, DG_Y, DG_C, DG_H, DG_W, DG_OH, DG_OW, DG_LANES, DG_K, DG_SH, DG_SW, DG_PT, DG_PL, DG_ACT,
 DG_ALPHA, DG_BETA, DG_RB, DG_PER_PLANE, DG_PR, DG_FAILED, DG_IN_SCALE, DG_IN_SHIFT, DG_OUT_SCALE,
 DG_OUT_SHIFT) = range(26)
ARGS_BYTES = 8 * 26

_T_SHAPES = cstr("X must have rank 4, F the shape [C, 1, K, K] with C = X's channels and K 3 or 5, "
                 "and B the shape [C]")
_T_BLOCK = cstr("the attribute block must be 8 or 16 and divide the channel count")
_T_MEMORY = cstr("could not allocate the scratch buffer of a block of rows")
_T_GEOMETRY = cstr("strides must be [sh >= 1, sw 1 or 2], pads 4 values below K, and the padded image "
                   "at least K on each side")


@njit(nogil=True, error_model="numpy", cache=True)
def rows_per_call(k, sw, lanes):
    """Outputs per register-blocked call: the R accumulators and the K filter vectors stay in vector
    registers while the input columns stream through them as operands (16 with AVX2, 32 with AVX-512)."""
    if lanes == 16:
        return ROWS_512
    return ROWS if k == 3 and sw == 1 else ROWS_WIDE


@njit(nogil=True, error_model="numpy", cache=True)
def _call(s, rs, fa, ky0, ky1, ba, d, ep, r, k, sw, lanes):
    """``dw_row`` for r outputs: r is rows_per_call(k, sw, lanes), 1, or ROWS_WIDE with 16 lanes."""
    if r == 1:
        if lanes == 8:
            if k == 3:
                dw_row(s, rs, fa, ky0, ky1, ba, d, ep, 1, 3, 1, 8)
            else:
                dw_row(s, rs, fa, ky0, ky1, ba, d, ep, 1, 5, 1, 8)
        elif k == 3:
            dw_row(s, rs, fa, ky0, ky1, ba, d, ep, 1, 3, 1, 16)
        else:
            dw_row(s, rs, fa, ky0, ky1, ba, d, ep, 1, 5, 1, 16)
    elif lanes == 8:
        if k == 3:
            if sw == 1:
                dw_row(s, rs, fa, ky0, ky1, ba, d, ep, ROWS, 3, 1, 8)
            else:
                dw_row(s, rs, fa, ky0, ky1, ba, d, ep, ROWS_WIDE, 3, 2, 8)
        elif sw == 1:
            dw_row(s, rs, fa, ky0, ky1, ba, d, ep, ROWS_WIDE, 5, 1, 8)
        else:
            dw_row(s, rs, fa, ky0, ky1, ba, d, ep, ROWS_WIDE, 5, 2, 8)
    elif r == ROWS_WIDE:
        if k == 3:
            if sw == 1:
                dw_row(s, rs, fa, ky0, ky1, ba, d, ep, ROWS_WIDE, 3, 1, 16)
            else:
                dw_row(s, rs, fa, ky0, ky1, ba, d, ep, ROWS_WIDE, 3, 2, 16)
        elif sw == 1:
            dw_row(s, rs, fa, ky0, ky1, ba, d, ep, ROWS_WIDE, 5, 1, 16)
        else:
            dw_row(s, rs, fa, ky0, ky1, ba, d, ep, ROWS_WIDE, 5, 2, 16)
    elif k == 3:
        if sw == 1:
            dw_row(s, rs, fa, ky0, ky1, ba, d, ep, ROWS_512, 3, 1, 16)
        else:
            dw_row(s, rs, fa, ky0, ky1, ba, d, ep, ROWS_512, 3, 2, 16)
    elif sw == 1:
        dw_row(s, rs, fa, ky0, ky1, ba, d, ep, ROWS_512, 5, 1, 16)
    else:
        dw_row(s, rs, fa, ky0, ky1, ba, d, ep, ROWS_512, 5, 2, 16)


@njit(nogil=True, error_model="numpy", cache=True)
def _interior(src, rs, fa, ky0, ky1, ba, dst, n, k, sw, lanes, ep):
    """n outputs of one row whose taps are all inside the row at src (row stride rs floats): R at a
    time (R = rows_per_call), then the rest: with 16 lanes ROWS_WIDE at a time, else one call of R;
    the last call overlapping the ones done (the same values are written twice); one by one when n
    is below the smallest call; the epilogue words at ep."""
    r = rows_per_call(k, sw, lanes)
    tail = ROWS_WIDE if lanes == 16 else r  # the 16-lane kernels also have a ROWS_WIDE form
    step = sw * lanes * 4
    done = 0
    while n - done >= r:
        _call(src + done * step, rs, fa, ky0, ky1, ba, dst + done * lanes * 4, ep, r, k, sw, lanes)
        done += r
    if done == n:
        return
    if n < tail:
        for i in range(n):
            _call(src + i * step, rs, fa, ky0, ky1, ba, dst + i * lanes * 4, ep, 1, k, sw, lanes)
        return
    while done < n:
        done = min(done, n - tail)
        _call(src + done * step, rs, fa, ky0, ky1, ba, dst + done * lanes * 4, ep, tail, k, sw, lanes)
        done += tail


@njit(nogil=True, error_model="numpy", cache=True)
def fill_strip(xa, h, w, lanes, iy0, rows, c0, cols, buf, scale, shift):
    """Columns c0 .. c0 + cols of the input rows iy0 .. iy0 + rows of the plane at xa [H, W, lanes],
    each value v as scale * v + shift, into ``buf`` [rows, cols, lanes]; columns and rows outside the
    image are zero (the padding). Each row is copied through views that start at its first value
    (``copy_f32``): vector loads and stores."""
    lo = min(max(0, -c0), cols)  # the strip's columns inside the image: lo .. hi
    hi = max(lo, min(cols, w - c0))
    inside = (hi - lo) * lanes
    for j in range(rows):
        iy = iy0 + j
        b = f32_view(buf + 4 * j * cols * lanes, cols * lanes)
        if 0 <= iy < h:
            src = xa + 4 * (iy * w + c0 + lo) * lanes
            dst = buf + 4 * (j * cols + lo) * lanes
            b[:lo * lanes] = ZERO
            if scale == ONE and shift == ZERO:
                copy_f32(src, dst, inside)
            else:
                x = f32_view(src, inside)
                out = f32_view(dst, inside)
                for i in range(inside):
                    out[i] = scale * x[i] + shift
            b[hi * lanes:] = ZERO
        else:
            b[:] = ZERO


@njit(nogil=True, error_model="numpy", cache=True)
def _epilogue(row, act, alpha, out_scale, out_shift):
    """The epilogues that need exp (the others are applied by ``dw_row``), then the output's affine
    map (``dw_row`` applies it after the others)."""
    if act == ACT_QUICK_GELU and alpha == ONE:  # v / (1 + e**-v): SiLU, one division per vector
        for i in range(row.shape[0]):
            row[i] = silu_f32(row[i])
    elif act == ACT_QUICK_GELU:  # v / (1 + e**(-alpha v)) = silu(alpha v) / alpha
        inv = ONE / alpha
        for i in range(row.shape[0]):
            row[i] = silu_f32(alpha * row[i]) * inv
    elif act == ACT_SIGMOID:
        for i in range(row.shape[0]):
            row[i] = sigmoid_f32(row[i])
    if out_scale != ONE or out_shift != ZERO:
        for i in range(row.shape[0]):
            row[i] = out_scale * row[i] + out_shift


@njit(nogil=True, error_model="numpy", cache=True)
def epilogue_words(ep, act, alpha, beta, out_scale, out_shift):
    """The eight words (a, b, lo, hi, g, c, d, f) of ``dw_row``'s epilogue for ``act`` and the output's
    affine map at ``ep`` (the map is ``_epilogue``'s after an exp epilogue: there c, d, f = 1, 0, 0)."""
    inf = np.float32(np.inf)
    a, b, lo, hi, g = ONE, ZERO, -inf, inf, ZERO
    c, d, f = ONE, ZERO, ZERO
    if act not in ROW_PASS_ACTS and (out_scale != ONE or out_shift != ZERO):
        c, d, f = out_scale, out_shift, ONE
    if act == ACT_RELU:
        lo = ZERO
    elif act == ACT_CLIP:
        lo, hi = alpha, beta
    elif act in (ACT_HARD_SIGMOID, ACT_HARD_SWISH):
        a, b, lo, hi = alpha, beta, ZERO, ONE
        g = ONE if act == ACT_HARD_SWISH else ZERO
    for i, v in enumerate((a, b, lo, hi, g, c, d, f)):
        store_f32(ep + 4 * i, v)


@njit(nogil=True, error_model="numpy", cache=True)
def split_columns(w, ow, k, sw, pl, lanes):
    """(lo, hi): outputs lo .. hi read only columns inside the image and are computed in place;
    those left of lo and right of hi from zero-padded strips. At stride 1, when the outputs in place
    would take fewer than ``MIN_CALLS`` register-blocked calls, lo = hi = ow: one strip holds every
    column (a narrow image: copying it once costs less than the single-output calls at its borders;
    at stride 2 the copy is twice as large per output and the borders half as wide)."""
    lo = min(ow, (pl + sw - 1) // sw)
    hi = max(lo, min(ow, (w - k + pl) // sw + 1))
    if sw == 1 and hi - lo < MIN_CALLS * rows_per_call(k, sw, lanes):
        return ow, ow
    return lo, hi


@njit(nogil=True, error_model="numpy", cache=True)
def _strip_cols(o0, o1, k, sw):
    return (o1 - o0 - 1) * sw + k if o1 > o0 else 0


@njit(nogil=True, error_model="numpy", cache=True)
def scratch_floats(rb, sh, k, w, ow, sw, pl, lanes):
    """Floats of one block's scratch (``dw_plane``) for rb output rows: the epilogue words, the
    prologue's filter, bias and tap row sums (K*K + K + 1 vectors), then the strips of the input rows
    they read."""
    lo, hi = split_columns(w, ow, k, sw, pl, lanes)
    cols = _strip_cols(0, lo, k, sw) + _strip_cols(hi, ow, k, sw)
    return ((rb - 1) * sh + k) * cols * lanes + 8 + (k * k + k + 1) * lanes


@njit(nogil=True, error_model="numpy", cache=True)
def _prologue_filter(fa, k, lanes, scale, fs, sums):
    """fs = scale * the filter at fa [K, K, lanes]; sums[ky] = the sum of its row ky's taps (unscaled).
    Every loop indexes a view from zero (vector code, as ``fill_strip``)."""
    f = f32_view(fa, k * k * lanes)
    scaled = f32_view(fs, k * k * lanes)
    for i in range(k * k * lanes):
        scaled[i] = scale * f[i]
    for ky in range(k):
        rsum = f32_view(sums + 4 * ky * lanes, lanes)
        for lane in range(lanes):
            rsum[lane] = ZERO
        for kx in range(k):
            tap = f32_view(fa + 4 * (ky * k + kx) * lanes, lanes)
            for lane in range(lanes):
                rsum[lane] += tap[lane]


@njit(nogil=True, error_model="numpy", cache=True)
def _prologue_bias(ba, sums, k, ky0, ky1, lanes, shift, out):
    """out = bias + shift * (sum of the taps on rows ky0 .. ky1): the bias of an output whose taps on
    those rows are inside the image, X' = scale * X + shift there."""
    b = f32_view(ba, lanes)
    o = f32_view(out, lanes)
    for lane in range(lanes):
        o[lane] = ZERO
    for ky in range(ky0, ky1):
        rsum = f32_view(sums + 4 * ky * lanes, lanes)
        for lane in range(lanes):
            o[lane] += rsum[lane]
    for lane in range(lanes):
        o[lane] = b[lane] + shift * o[lane]


@njit(nogil=True, error_model="numpy", cache=True)
def dw_plane(xa, fa, ba, ya, h, w, oh, ow, lanes, k, sh, sw, pt, pl, oy0, oy1, act, alpha, beta, buf, scale,
             shift, out_scale, out_shift):
    """Output rows oy0..oy1 of one channel block of one image: xa its input plane [H, W, lanes], fa
    its filter [K, K, lanes], ba its bias [lanes], ya its output plane [OH, OW, lanes]; ``buf``:
    scratch_floats(oy1 - oy0, ...) floats; the prologue X' = scale * X + shift and the output's map
    out_scale * act(...) + out_shift (module docstring).
    Outputs whose taps all fall inside the image read X in place (rows of the padding above and
    below skipped); the others read zero-padded strips of X' on the block's input rows, copied once."""
    ep = buf
    epilogue_words(ep, act, alpha, beta, out_scale, out_shift)
    lo, hi = split_columns(w, ow, k, sw, pl, lanes)
    cl = _strip_cols(0, lo, k, sw)
    cr = _strip_cols(hi, ow, k, sw)
    rows = (oy1 - oy0 - 1) * sh + k
    affine = scale != ONE or shift != ZERO
    fs = buf + 32  # the prologue's filter, the bias of the current row, the taps' row sums
    row_bias = fs + 4 * k * k * lanes
    sums = row_bias + 4 * lanes
    left = sums + 4 * k * lanes
    right = left + 4 * rows * cl * lanes
    fin, bin_ = fa, ba  # the filter and bias of the outputs computed in place
    if affine:
        _prologue_filter(fa, k, lanes, scale, fs, sums)
        fin, bin_ = fs, row_bias
    iy_top = oy0 * sh - pt
    if cl > 0:
        fill_strip(xa, h, w, lanes, iy_top, rows, -pl, cl, left, scale, shift)
    if cr > 0:
        fill_strip(xa, h, w, lanes, iy_top, rows, hi * sw - pl, cr, right, scale, shift)
    rs = w * lanes
    y = f32_view(ya, oh * ow * lanes)
    for oy in range(oy0, oy1):
        base = oy * ow * lanes
        row = ya + 4 * base
        j = (oy - oy0) * sh  # the strips' row of tap row 0
        if lo > 0:
            _interior(left + 4 * j * cl * lanes, cl * lanes, fa, 0, k, ba, row, lo, k, sw, lanes, ep)
        if hi > lo:
            iy0 = oy * sh - pt
            ky0, ky1 = max(0, -iy0), min(k, h - iy0)
            if affine:
                _prologue_bias(ba, sums, k, ky0, ky1, lanes, shift, row_bias)
            _interior(xa + 4 * (iy0 * rs + (lo * sw - pl) * lanes), rs, fin, ky0, ky1, bin_,
                      row + 4 * lo * lanes, hi - lo, k, sw, lanes, ep)
        if ow > hi:
            _interior(right + 4 * j * cr * lanes, cr * lanes, fa, 0, k, ba, row + 4 * hi * lanes, ow - hi, k, sw,
                      lanes, ep)
        if act in ROW_PASS_ACTS:
            _epilogue(y[base:base + ow * lanes], act, alpha, out_scale, out_shift)


def compute_depthwise_conv(kernel, ctx):
    """Check X [N, C, H, W], F [C, 1, K, K], B [C], block, strides, pads; allocate Y; run the blocks."""
    api = slot_api(kernel)
    st = check_input_count(api, ctx, kernel, 3)
    if st != 0:
        return st
    dx = stack_bytes(DIMS_BYTES)
    df = stack_bytes(DIMS_BYTES)
    db = stack_bytes(DIMS_BYTES)
    st, px, rx = read_float_input(api, ctx, kernel, 0, dx)
    if st != 0:
        return st
    st, pf, rf = read_float_input(api, ctx, kernel, 1, df)
    if st != 0:
        return st
    st, pb, rb = read_float_input(api, ctx, kernel, 2, db)
    if st != 0:
        return st
    if rx != 4 or rf != 4 or rb != 1:
        return fail(api, kernel, _T_SHAPES)
    n = load_i64(dx)
    c = load_i64(dx + 8)
    h = load_i64(dx + 16)
    w = load_i64(dx + 24)
    k = load_i64(df + 16)
    if load_i64(df) != c or load_i64(df + 8) != 1 or load_i64(df + 24) != k or (k != 3 and k != 5) \
            or load_i64(db) != c:
        return fail(api, kernel, _T_SHAPES)
    lanes = slot_i64(kernel, DA_BLOCK)
    if (lanes != 8 and lanes != 16) or c % lanes != 0 or c == 0:
        return fail(api, kernel, _T_BLOCK)
    sh = slot_i64(kernel, DA_STRIDES + 1)
    sw = slot_i64(kernel, DA_STRIDES + 2)
    pt = slot_i64(kernel, DA_PADS + 1)
    pl = slot_i64(kernel, DA_PADS + 2)
    pb_ = slot_i64(kernel, DA_PADS + 3)
    pr = slot_i64(kernel, DA_PADS + 4)
    ok = slot_i64(kernel, DA_STRIDES) == 2 and slot_i64(kernel, DA_PADS) == 4 and sh >= 1 and (sw == 1 or sw == 2)
    for p in (pt, pl, pb_, pr):
        ok = ok and 0 <= p < k
    if not ok or h + pt + pb_ < k or w + pl + pr < k:
        return fail(api, kernel, _T_GEOMETRY)
    oh = (h + pt + pb_ - k) // sh + 1
    ow = (w + pl + pr - k) // sw + 1
    store_i64(dx + 16, oh)
    store_i64(dx + 24, ow)
    st, py = make_output(api, ctx, 0, dx, 4)
    if st != 0 or n * oh * ow == 0:
        return st
    act = slot_i64(kernel, DA_ACT + 1) + 1 if slot_i64(kernel, DA_ACT) > 0 else ACT_NONE
    planes = n * (c // lanes)
    per_plane = max(1, min(oh, (TARGET_BLOCKS + planes - 1) // planes))
    rb = (oh + per_plane - 1) // per_plane
    lo, hi = split_columns(w, ow, k, sw, pl, lanes)
    cols = _strip_cols(0, lo, k, sw) + _strip_cols(hi, ow, k, sw)
    if cols > 0:
        rb = max(1, min(rb, (SCRATCH_FLOATS // (cols * lanes) - k) // sh + 1))
    per_plane = (oh + rb - 1) // rb
    args = stack_bytes(ARGS_BYTES)
    for word, value in ((DG_X, px), (DG_F, pf), (DG_B, pb), (DG_Y, py), (DG_C, c), (DG_H, h), (DG_W, w),
                        (DG_OH, oh), (DG_OW, ow), (DG_LANES, lanes), (DG_K, k), (DG_SH, sh), (DG_SW, sw),
                        (DG_PT, pt), (DG_PL, pl), (DG_PR, pr), (DG_ACT, act), (DG_RB, rb),
                        (DG_PER_PLANE, per_plane)):
        store_i64(args + 8 * word, value)
    store_f64(args + 8 * DG_ALPHA, np.float64(slot_f32(kernel, DA_ALPHA)))
    store_f64(args + 8 * DG_BETA, np.float64(slot_f32(kernel, DA_BETA)))
    store_f64(args + 8 * DG_IN_SCALE, np.float64(slot_f32(kernel, DA_IN_SCALE)))
    store_f64(args + 8 * DG_IN_SHIFT, np.float64(slot_f32(kernel, DA_IN_SHIFT)))
    store_f64(args + 8 * DG_OUT_SCALE, np.float64(slot_f32(kernel, DA_OUT_SCALE)))
    store_f64(args + 8 * DG_OUT_SHIFT, np.float64(slot_f32(kernel, DA_OUT_SHIFT)))
    # cost in elementwise-equivalent units: multiply-adds / 4
    st = run_blocks(api, ctx, kernel, args, planes * per_plane, n * c * oh * ow * k * k // 4)
    if st == 0 and load_i64(args + 8 * DG_FAILED) != 0:
        return fail(api, kernel, _T_MEMORY)
    return st


def _depthwise_worker(args, block):
    c = load_i64(args + 8 * DG_C)
    h = load_i64(args + 8 * DG_H)
    w = load_i64(args + 8 * DG_W)
    oh = load_i64(args + 8 * DG_OH)
    ow = load_i64(args + 8 * DG_OW)
    lanes = load_i64(args + 8 * DG_LANES)
    k = load_i64(args + 8 * DG_K)
    sh = load_i64(args + 8 * DG_SH)
    pl = load_i64(args + 8 * DG_PL)
    rb = load_i64(args + 8 * DG_RB)
    per_plane = load_i64(args + 8 * DG_PER_PLANE)
    plane = block // per_plane  # image * (C / lanes) + channel block
    oy0 = (block % per_plane) * rb
    oy1 = min(oh, oy0 + rb)
    cb = plane % (c // lanes)
    sw = load_i64(args + 8 * DG_SW)
    buf = c_malloc(4 * scratch_floats(oy1 - oy0, sh, k, w, ow, sw, pl, lanes))
    if buf == 0:
        store_i64(args + 8 * DG_FAILED, 1)
        return
    dw_plane(load_i64(args + 8 * DG_X) + 4 * plane * h * w * lanes, load_i64(args + 8 * DG_F) + 4 * cb * k * k * lanes,
             load_i64(args + 8 * DG_B) + 4 * cb * lanes, load_i64(args + 8 * DG_Y) + 4 * plane * oh * ow * lanes,
             h, w, oh, ow, lanes, k, sh, sw, load_i64(args + 8 * DG_PT), pl, oy0, oy1,
             load_i64(args + 8 * DG_ACT), np.float32(load_f64(args + 8 * DG_ALPHA)),
             np.float32(load_f64(args + 8 * DG_BETA)), buf, np.float32(load_f64(args + 8 * DG_IN_SCALE)),
             np.float32(load_f64(args + 8 * DG_IN_SHIFT)), np.float32(load_f64(args + 8 * DG_OUT_SCALE)),
             np.float32(load_f64(args + 8 * DG_OUT_SHIFT)))
    c_free(buf)


NATIVE_OPS = (NativeOpDef(OP, ("X", "F", "B"), compute_depthwise_conv, _depthwise_worker, attrs=ATTRS),)
