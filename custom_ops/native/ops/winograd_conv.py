"""``FusedWinogradConvBlocked``: a 3x3, stride-1, pads-1 convolution (group 1, no dilation) with its
bias and an elementwise epilogue, on tensors in ORT's NCHWc blocked layout, computed as Winograd
F(4x4, 3x3) (``custom_ops/kernels/winograd.py``; docs/ARCHITECTURE.md §9); and
``FusedWinogradConvAddBlocked``, the same with a residual R added after the epilogue.

Inputs, float32: X of logical shape [N, Cin, H, W] whose memory is [N, Cin / block, H, W, block]
(as ORT's blocked ops hold it); U [36, Cin, Cout], the filter in the Winograd domain
(``conv_filters.transform_filter``, made once when the graph is planned); B [Cout]. Attributes:
``block`` (8 or 16, the NCHWc block; Cin and Cout multiples of it), ``activation`` (absent: none;
``relu``; ``quick_gelu``: v * sigmoid(alpha * v)), ``alpha`` (default 1). Output Y [N, Cout, H, W],
blocked like X:

    Y = act(conv3x3(X, w, pads 1) + B)              (FusedWinogradConvBlocked)
    Y = act(conv3x3(X, w, pads 1) + B) + R          (FusedWinogradConvAddBlocked; R blocked like Y)

Any other rank, shape or block is an ORT error status naming what was expected.

Work is split into blocks of up to ``tiles_per_block`` 4x4 output tiles of one image, in row-major
order over its tile grid (and, when that gives fewer than ``MIN_SPLIT_BLOCKS`` blocks, of a share
of the output channels); each block transforms its input patches for every input channel into a scratch buffer sized
for the L2 cache, multiplies, and writes its output tiles with the epilogue applied while they are
in cache.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.intrinsics import c_free, c_malloc, load_f64, load_i64, stack_bytes, store_f64, store_i64
from ortfuse.custom_ops.kernels.conv_filters import ALPHA, POSITIONS, TILE
from ortfuse.custom_ops.kernels.scalar import relu1
from ortfuse.custom_ops.kernels.winograd import input_tile, micro_gemm, output_tile
from ortfuse.custom_ops.native.elementwise import copy_f32, f32_view
from ortfuse.custom_ops.native.inputs import check_input_count, fail, make_output, read_float_input
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.slots import slot_api, slot_f32, slot_i64
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import DIMS_BYTES
from ortfuse.custom_ops.status_messages import cstr
from ortfuse.custom_ops.vecmath import sigmoid_f32, silu_f32

OP = "FusedWinogradConvBlocked"
OP_ADD = "FusedWinogradConvAddBlocked"
ACTIVATIONS = ("relu", "quick_gelu")
ACT_NONE, ACT_RELU, ACT_QUICK_GELU = 0, 1, 2
WA_BLOCK, WA_ALPHA, WA_ACT = 0, 1, 2  # attribute words (activation: count, index)
ATTRS = (AttrDef("block", "int", WA_BLOCK), AttrDef("alpha", "float", WA_ALPHA, required=False, default=1.0),
         AttrDef("activation", "choice", WA_ACT, required=False, choices=ACTIVATIONS, max_steps=1))
ROWS = 4  # tiles per micro-kernel call
SCRATCH_FLOATS = 48 * 1024  # transformed input per block: 192 KB, within a core's L2
MAX_TILES = 32
# args block (int64 words)
(WG_SLOT, WG_X, WG_U, WG_B, WG_Y, WG_N, WG_CIN, WG_COUT, WG_H, WG_W, WG_LANES, WG_TB, WG_PER_IMAGE, WG_GRID, WG_ACT,
 WG_ALPHA, WG_FAILED, WG_SPLIT, WG_CHUNK, WG_R) = range(20)
ARGS_BYTES = 8 * 20
MIN_BLOCKS = 16  # blocks of tiles wanted per image: smaller blocks down to ROWS tiles
MIN_SPLIT_BLOCKS = 4  # below this many blocks of tiles, output channels are split too (inputs transformed again)

_T_SHAPES = cstr("X must have rank 4, U the shape [36, Cin, Cout] with Cin = X's channels, and B the shape [Cout]")
_T_BLOCK = cstr("the attribute block must be 8 or 16 and divide both channel counts")
_T_RESIDUAL = cstr("R must have the shape of the output [N, Cout, H, W]")
_T_MEMORY = cstr("could not allocate the scratch buffer of a block of tiles")


@njit(nogil=True, error_model="numpy", cache=True)
def odd_lines(n):
    """n floats rounded up to whole 64-byte lines, an odd number of them: the 36 position rows of a
    scratch buffer then fall in different cache sets."""
    n = (n + 15) // 16 * 16
    return n + 16 if (n // 16) % 2 == 0 else n


@njit(nogil=True, error_model="numpy", cache=True)
def _gemm(va, cin, ua, ldu, ma, ldm, cols, rows, lanes):
    """M[rows, cols] = V[rows, cin] @ U[cin, cols] for one position (row strides cin, ldu, ldm;
    rows a multiple of ROWS, cols of lanes)."""
    for t0 in range(0, rows, ROWS):
        a = va + 4 * t0 * cin
        c = ma + 4 * t0 * ldm
        n0 = 0
        while n0 < cols:
            left = (cols - n0) // lanes
            if lanes == 8:
                if left >= 3:
                    micro_gemm(a, cin, ua + 4 * n0, ldu, c + 4 * n0, ldm, cin, 4, 3, 8)
                    n0 += 24
                elif left == 2:
                    micro_gemm(a, cin, ua + 4 * n0, ldu, c + 4 * n0, ldm, cin, 4, 2, 8)
                    n0 += 16
                else:
                    micro_gemm(a, cin, ua + 4 * n0, ldu, c + 4 * n0, ldm, cin, 4, 1, 8)
                    n0 += 8
            else:
                if left >= 3:
                    micro_gemm(a, cin, ua + 4 * n0, ldu, c + 4 * n0, ldm, cin, 4, 3, 16)
                    n0 += 48
                elif left == 2:
                    micro_gemm(a, cin, ua + 4 * n0, ldu, c + 4 * n0, ldm, cin, 4, 2, 16)
                    n0 += 32
                else:
                    micro_gemm(a, cin, ua + 4 * n0, ldu, c + 4 * n0, ldm, cin, 4, 1, 16)
                    n0 += 16


@njit(nogil=True, error_model="numpy", cache=True)
def epilogue_rows(row, act, alpha):
    """The epilogue ``act`` on a row of outputs in place: relu; quick_gelu v * sigmoid(alpha * v),
    for alpha 1 (SiLU, as ORT makes QuickGelu of Sigmoid -> Mul) v / (1 + e**-v), one division."""
    if act == ACT_RELU:
        for i in range(row.shape[0]):
            row[i] = relu1(row[i])
    elif act == ACT_QUICK_GELU and alpha == np.float32(1.0):
        for i in range(row.shape[0]):
            row[i] = silu_f32(row[i])
    elif act == ACT_QUICK_GELU:
        for i in range(row.shape[0]):
            v = row[i]
            row[i] = v * sigmoid_f32(alpha * v)


@njit(nogil=True, error_model="numpy", cache=True)
def conv_tiles(xa, ua, ba, ya, h, wd, cin, cout, t0, t1, co0, co1, lanes, act, alpha, scratch, tbp, ra):
    """Output tiles t0..t1 of one image (row-major over its tile grid; xa, ya: that image's X and
    Y), output channels co0..co1 (multiples of lanes). ``scratch``: scratch_floats(tbp, ...) floats
    for the transformed inputs, the products and one padded patch. ``ra``: that image's residual,
    added after the epilogue (0: none)."""
    nt = t1 - t0
    ntp = (nt + ROWS - 1) // ROWS * ROWS
    ntx = (wd + TILE - 1) // TILE
    vs = odd_lines(tbp * cin)
    ms = odd_lines(tbp * cout)
    va = scratch
    ma = va + 4 * POSITIONS * vs
    da = ma + 4 * POSITIONS * ms
    rs = wd * lanes
    for cb in range(cin // lanes):
        c0 = cb * lanes
        plane = cb * h * rs
        for t in range(nt):
            y0 = ((t0 + t) // ntx) * TILE - 1
            x0 = ((t0 + t) % ntx) * TILE - 1
            dst = va + 4 * (t * cin + c0)
            if y0 >= 0 and y0 + ALPHA <= h and x0 >= 0 and x0 + ALPHA <= wd:
                src = xa + 4 * (plane + y0 * rs + x0 * lanes)
                if lanes == 8:
                    input_tile(src, rs, lanes, dst, vs, 8)
                else:
                    input_tile(src, rs, lanes, dst, vs, 16)
            else:  # a border tile: the patch with its zero padding first
                for i in range(ALPHA):
                    yy = y0 + i
                    for j in range(ALPHA):
                        xx = x0 + j
                        cell = da + 4 * (i * ALPHA + j) * lanes
                        if 0 <= yy < h and 0 <= xx < wd:
                            copy_f32(xa + 4 * (plane + yy * rs + xx * lanes), cell, lanes)
                        else:
                            f32_view(cell, lanes)[:] = np.float32(0.0)
                if lanes == 8:
                    input_tile(da, ALPHA * lanes, lanes, dst, vs, 8)
                else:
                    input_tile(da, ALPHA * lanes, lanes, dst, vs, 16)
        for t in range(nt, ntp):  # rows the micro-kernel reads past the last tile
            for p in range(POSITIONS):
                f32_view(va + 4 * (p * vs + t * cin + c0), lanes)[:] = np.float32(0.0)
    for p in range(POSITIONS):
        _gemm(va + 4 * p * vs, cin, ua + 4 * (p * cin * cout + co0), cout, ma + 4 * (p * ms + co0), cout, co1 - co0,
              ntp, lanes)
    for ob in range(co0 // lanes, co1 // lanes):
        c0 = ob * lanes
        plane = ob * h * rs
        bias = ba + 4 * c0
        for t in range(nt):
            oy0 = ((t0 + t) // ntx) * TILE
            ox0 = ((t0 + t) % ntx) * TILE
            src = ma + 4 * (t * cout + c0)
            if oy0 + TILE <= h and ox0 + TILE <= wd:
                dst = ya + 4 * (plane + oy0 * rs + ox0 * lanes)
                if lanes == 8:
                    output_tile(src, ms, bias, dst, rs, lanes, 8)
                else:
                    output_tile(src, ms, bias, dst, rs, lanes, 16)
            else:  # a border tile: its 4x4 outputs in the patch buffer, the ones inside copied
                if lanes == 8:
                    output_tile(src, ms, bias, da, TILE * lanes, lanes, 8)
                else:
                    output_tile(src, ms, bias, da, TILE * lanes, lanes, 16)
                for i in range(min(TILE, h - oy0)):
                    for j in range(min(TILE, wd - ox0)):
                        copy_f32(da + 4 * (i * TILE + j) * lanes,
                                 ya + 4 * (plane + (oy0 + i) * rs + (ox0 + j) * lanes), lanes)
            if act != ACT_NONE or ra != 0:  # the tile's rows while they are in cache
                for i in range(min(TILE, h - oy0)):
                    at = plane + (oy0 + i) * rs + ox0 * lanes
                    span = min(TILE, wd - ox0) * lanes
                    row = f32_view(ya + 4 * at, span)
                    epilogue_rows(row, act, alpha)
                    if ra != 0:
                        res = f32_view(ra + 4 * at, span)
                        for j in range(span):
                            row[j] += res[j]


@njit(nogil=True, error_model="numpy", cache=True)
def scratch_floats(tbp, cin, cout, lanes):
    """Floats of one block's scratch (conv_tiles)."""
    return POSITIONS * (odd_lines(tbp * cin) + odd_lines(tbp * cout)) + POSITIONS * lanes


@njit(nogil=True, error_model="numpy", cache=True)
def tiles_per_block(cin, tiles):
    """Tiles per block: a multiple of ROWS, the transformed inputs of all of them within
    SCRATCH_FLOATS, at most MAX_TILES, and small enough for MIN_BLOCKS blocks where the image has
    the tiles."""
    tb = max(ROWS, min(MAX_TILES, SCRATCH_FLOATS // (POSITIONS * cin)) // ROWS * ROWS)
    share = ((tiles + MIN_BLOCKS - 1) // MIN_BLOCKS + ROWS - 1) // ROWS * ROWS
    return max(ROWS, min(tb, share))


@njit(cache=True)
def _compute(kernel, ctx, residual):
    """Check X [N, Cin, H, W], U [36, Cin, Cout], B [Cout], the block (and R [N, Cout, H, W] with
    ``residual``); allocate Y; run the blocks."""
    api = slot_api(kernel)
    st = check_input_count(api, ctx, kernel, 4 if residual else 3)
    if st != 0:
        return st
    dx = stack_bytes(DIMS_BYTES)
    du = stack_bytes(DIMS_BYTES)
    db = stack_bytes(DIMS_BYTES)
    st, px, rx = read_float_input(api, ctx, kernel, 0, dx)
    if st != 0:
        return st
    st, pu, ru = read_float_input(api, ctx, kernel, 1, du)
    if st != 0:
        return st
    st, pb, rb = read_float_input(api, ctx, kernel, 2, db)
    if st != 0:
        return st
    if rx != 4 or ru != 3 or rb != 1:
        return fail(api, kernel, _T_SHAPES)
    n = load_i64(dx)
    cin = load_i64(dx + 8)
    h = load_i64(dx + 16)
    wd = load_i64(dx + 24)
    cout = load_i64(du + 16)
    if load_i64(du) != POSITIONS or load_i64(du + 8) != cin or load_i64(db) != cout:
        return fail(api, kernel, _T_SHAPES)
    lanes = slot_i64(kernel, WA_BLOCK)
    if (lanes != 8 and lanes != 16) or cin % lanes != 0 or cout % lanes != 0 or cin == 0 or cout == 0:
        return fail(api, kernel, _T_BLOCK)
    store_i64(dx + 8, cout)
    pr = 0
    if residual:
        dr = stack_bytes(DIMS_BYTES)
        st, pr, rr = read_float_input(api, ctx, kernel, 3, dr)
        if st != 0:
            return st
        if rr != 4 or load_i64(dr) != n or load_i64(dr + 8) != cout or load_i64(dr + 16) != h \
                or load_i64(dr + 24) != wd:
            return fail(api, kernel, _T_RESIDUAL)
    st, py = make_output(api, ctx, 0, dx, 4)
    if st != 0 or n * h * wd == 0:
        return st
    act = slot_i64(kernel, WA_ACT + 1) + 1 if slot_i64(kernel, WA_ACT) > 0 else ACT_NONE
    grid = ((h + TILE - 1) // TILE) * ((wd + TILE - 1) // TILE)
    tb = tiles_per_block(cin, grid)
    per_image = (grid + tb - 1) // tb
    tiles = n * per_image
    nob = cout // lanes
    split = max(1, min((MIN_SPLIT_BLOCKS + tiles - 1) // tiles, nob // 3))
    chunk = (nob + split - 1) // split * lanes
    split = (cout + chunk - 1) // chunk
    args = stack_bytes(ARGS_BYTES)
    for word, value in ((WG_SLOT, kernel), (WG_X, px), (WG_U, pu), (WG_B, pb), (WG_Y, py), (WG_N, n),
                        (WG_CIN, cin), (WG_COUT, cout), (WG_H, h), (WG_W, wd), (WG_LANES, lanes), (WG_TB, tb),
                        (WG_PER_IMAGE, per_image), (WG_GRID, grid), (WG_ACT, act), (WG_SPLIT, split),
                        (WG_CHUNK, chunk), (WG_R, pr)):
        store_i64(args + 8 * word, value)
    store_f64(args + 8 * WG_ALPHA, np.float64(slot_f32(kernel, WA_ALPHA)))
    # cost in elementwise-equivalent units: multiply-adds of the Winograd products / 16
    st = run_blocks(api, ctx, kernel, args, tiles * split, n * grid * POSITIONS * cin * cout // 16)
    if st == 0 and load_i64(args + 8 * WG_FAILED) != 0:
        return fail(api, kernel, _T_MEMORY)
    return st


def compute_winograd_conv(kernel, ctx):
    """FusedWinogradConvBlocked: X, U, B."""
    return _compute(kernel, ctx, False)


def compute_winograd_conv_add(kernel, ctx):
    """FusedWinogradConvAddBlocked: X, U, B, R."""
    return _compute(kernel, ctx, True)


def _winograd_worker(args, block):
    cin = load_i64(args + 8 * WG_CIN)
    cout = load_i64(args + 8 * WG_COUT)
    h = load_i64(args + 8 * WG_H)
    wd = load_i64(args + 8 * WG_W)
    lanes = load_i64(args + 8 * WG_LANES)
    tb = load_i64(args + 8 * WG_TB)
    per_image = load_i64(args + 8 * WG_PER_IMAGE)
    grid = load_i64(args + 8 * WG_GRID)
    split = load_i64(args + 8 * WG_SPLIT)
    chunk = load_i64(args + 8 * WG_CHUNK)
    co0 = (block % split) * chunk
    co1 = min(cout, co0 + chunk)
    image = (block // split) // per_image
    t0 = ((block // split) % per_image) * tb
    alpha = np.float32(load_f64(args + 8 * WG_ALPHA))
    scratch = c_malloc(4 * scratch_floats(tb, cin, cout, lanes))
    if scratch == 0:
        store_i64(args + 8 * WG_FAILED, 1)
        return
    ra = load_i64(args + 8 * WG_R)
    conv_tiles(load_i64(args + 8 * WG_X) + 4 * image * cin * h * wd, load_i64(args + 8 * WG_U),
               load_i64(args + 8 * WG_B), load_i64(args + 8 * WG_Y) + 4 * image * cout * h * wd, h, wd, cin, cout,
               t0, min(grid, t0 + tb), co0, co1, lanes, load_i64(args + 8 * WG_ACT), alpha, scratch, tb,
               ra + 4 * image * cout * h * wd if ra != 0 else 0)
    c_free(scratch)


NATIVE_OPS = (NativeOpDef(OP, ("X", "U", "B"), compute_winograd_conv, _winograd_worker, attrs=ATTRS),
              NativeOpDef(OP_ADD, ("X", "U", "B", "R"), compute_winograd_conv_add, _winograd_worker, attrs=ATTRS))
