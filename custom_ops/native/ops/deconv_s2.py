"""``FusedConvTransposeS2Blocked``: a ConvTranspose with a 2x2 kernel and stride 2 (no padding,
group 1) reading ORT's NCHWc blocked layout and writing plain NCHW, with its bias and an optional
Relu: the ReorderOutput before it and the Relu after it are folded in (docs/ARCHITECTURE.md §9).

Inputs, float32: X of logical shape [N, Cin, H, W] whose memory is [N, Cin / block, H, W, block];
Wt [4 * Cout, Cin], the filter w [Cin, Cout, 2, 2] as rows (o, a, b): Wt[(2 * o + a) * 2 + b, c] =
w[c, o, a, b] (``conv_filters.pack_deconv_filter``, made once when the graph is planned); B [Cout]. Attributes:
``block`` (1 to 64, dividing Cin), ``activation`` (absent: none; ``relu``). Output Y [N, Cout, 2H,
2W], plain:

    Y[n, o, 2i + a, 2j + b] = act(B[o] + sum_c X[n, c, i, j] * w[c, o, a, b])

``FusedConvTransposeS2x2Blocked`` chains a second such ConvTranspose onto the first (a DB head's
two upsamplings): inputs X, Wt, B as above and W2t [4 * Cout2, Cout], B2 [Cout2] (``pack_deconv_filter``
of w2 [Cout, Cout2, 2, 2]); attribute ``activation2`` (absent: none; ``relu``; ``sigmoid``) after
the second; output [N, Cout2, 4H, 4W], plain. The first one's output stays in the block's scratch.

Any other rank, shape or block is an ORT error status naming what was expected.

Each block of work is one input row of one image: its channels are gathered into rows over j
(padded to whole vectors), multiplied by Wt with the register-blocked ``micro_gemm`` (rows (o, a, b),
columns j), and each product row pair (b = 0, 1) interleaved into output row 2i + a.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.intrinsics import c_free, c_malloc, load_i64, stack_bytes, store_i64
from ortfuse.custom_ops.kernels.scalar import relu1
from ortfuse.custom_ops.kernels.winograd import micro_gemm
from ortfuse.custom_ops.native.elementwise import f32_view
from ortfuse.custom_ops.native.inputs import check_input_count, fail, make_output, read_float_input
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.slots import slot_api, slot_i64
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import DIMS_BYTES
from ortfuse.custom_ops.status_messages import cstr
from ortfuse.custom_ops.vecmath import sigmoid_f32

OP = "FusedConvTransposeS2Blocked"
OP2 = "FusedConvTransposeS2x2Blocked"
ACTIVATIONS = ("relu",)
ACTIVATIONS2 = ("relu", "sigmoid")
DA_BLOCK, DA_ACT, DA_ACT2 = 0, 1, 3  # attribute words (activation: count, index)
ATTRS = (AttrDef("block", "int", DA_BLOCK),
         AttrDef("activation", "choice", DA_ACT, required=False, choices=ACTIVATIONS, max_steps=1))
ATTRS2 = ATTRS + (AttrDef("activation2", "choice", DA_ACT2, required=False, choices=ACTIVATIONS2, max_steps=1),)
LANES = 8  # columns per vector of the product
MAX_BLOCK = 64
# args block (int64 words)
(DG_SLOT, DG_X, DG_W, DG_B, DG_Y, DG_CIN, DG_COUT, DG_H, DG_W_, DG_BLOCK, DG_ACT, DG_FAILED, DG_W2, DG_B2,
 DG_COUT2, DG_ACT2) = range(16)
ARGS_BYTES = 8 * 16

_T_SHAPES = cstr("X must have rank 4, Wt the shape [4 * Cout, Cin] with Cin = X's channels, and B the shape [Cout]")
_T_SHAPES2 = cstr("W2t must have the shape [4 * Cout2, Cout] and B2 the shape [Cout2]")
_T_BLOCK = cstr("the attribute block must be 1 to 64 and divide X's channels")
_T_MEMORY = cstr("could not allocate the scratch buffer of a row")


@njit(nogil=True, error_model="numpy", cache=True)
def padded(n):
    """Columns of a product row: n rounded up to whole micro-kernel calls (3 vectors)."""
    return (n + 3 * LANES - 1) // (3 * LANES) * (3 * LANES)


@njit(nogil=True, error_model="numpy", cache=True)
def _product(wa, cin, rows, ba, ldb, ca, ldc):
    """C[rows, ldc] = Wt[rows, cin] @ B[cin, ldc] (B's row stride ldb; ldc a multiple of 3 vectors)."""
    for r0 in range(0, rows, 4):
        for n0 in range(0, ldc, 3 * LANES):
            micro_gemm(wa + 4 * r0 * cin, cin, ba + 4 * n0, ldb, ca + 4 * (r0 * ldc + n0), ldc, cin, 4, 3, 8)


@njit(nogil=True, error_model="numpy", cache=True)
def _act(v, act):
    if act == 1:
        return relu1(v)
    if act == 2:
        return sigmoid_f32(v)
    return v


@njit(nogil=True, error_model="numpy", cache=True)
def _interleave(c, wp, cout, bias, cols, act, out, base, so, sa):
    """act(product + bias) into out: product row (o, a, b) (row stride wp), column j goes to
    out[base + o * so + a * sa + 2j + b]."""
    for o in range(cout):
        bo = bias[o]
        for a in range(2):
            at = base + o * so + a * sa
            row = out[at:at + 2 * cols]
            c0 = c[((o * 2 + a) * 2) * wp:((o * 2 + a) * 2) * wp + cols]
            c1 = c[((o * 2 + a) * 2 + 1) * wp:((o * 2 + a) * 2 + 1) * wp + cols]
            for j in range(cols):
                row[2 * j] = _act(c0[j] + bo, act)
                row[2 * j + 1] = _act(c1[j] + bo, act)


@njit(nogil=True, error_model="numpy", cache=True)
def _gather(xa, cin, h, wd, i, block, xt, wp):
    """Row i of the blocked X as rows over j: xt[c * wp + j] (zero past wd)."""
    x = f32_view(xa, cin * h * wd)
    for cb in range(cin // block):
        src = (cb * h + i) * wd * block
        for j in range(wd):
            for k in range(block):
                xt[(cb * block + k) * wp + j] = x[src + j * block + k]
    for k in range(cin):
        for j in range(wd, wp):
            xt[k * wp + j] = np.float32(0.0)


@njit(nogil=True, error_model="numpy", cache=True)
def deconv_row(xa, wa, ba, ya, cin, cout, h, wd, i, block, act, scratch):
    """Output rows 2i and 2i + 1 of one image (xa, ya: that image's X and Y)."""
    wp = padded(wd)
    ca = scratch + 4 * cin * wp
    _gather(xa, cin, h, wd, i, block, f32_view(scratch, cin * wp), wp)
    _product(wa, cin, 4 * cout, scratch, wp, ca, wp)
    _interleave(f32_view(ca, 4 * cout * wp), wp, cout, f32_view(ba, cout), wd, act,
                f32_view(ya, cout * 4 * h * wd), 4 * i * wd, 4 * h * wd, 2 * wd)


@njit(nogil=True, error_model="numpy", cache=True)
def deconv2_row(xa, wa, ba, w2a, b2a, ya, cin, cout, cout2, h, wd, i, block, act, act2, scratch):
    """Output rows 4i .. 4i + 3 of one image through both ConvTransposes; the first one's rows
    2i, 2i + 1 live in the scratch only."""
    wp = padded(wd)
    wp2 = padded(2 * wd)
    ca = scratch + 4 * cin * wp
    za = ca + 4 * 4 * cout * wp
    c2a = za + 4 * 2 * cout * wp2
    _gather(xa, cin, h, wd, i, block, f32_view(scratch, cin * wp), wp)
    _product(wa, cin, 4 * cout, scratch, wp, ca, wp)
    z = f32_view(za, 2 * cout * wp2)
    # z rows (a, o): the first output's row 2i + a, channel o
    _interleave(f32_view(ca, 4 * cout * wp), wp, cout, f32_view(ba, cout), wd, act, z, 0, wp2, cout * wp2)
    for a in range(2):
        for o in range(cout):
            for j in range(2 * wd, wp2):
                z[(a * cout + o) * wp2 + j] = np.float32(0.0)
    y = f32_view(ya, cout2 * 16 * h * wd)
    for a in range(2):
        _product(w2a, cout, 4 * cout2, za + 4 * a * cout * wp2, wp2, c2a, wp2)
        _interleave(f32_view(c2a, 4 * cout2 * wp2), wp2, cout2, f32_view(b2a, cout2), 2 * wd, act2, y,
                    (4 * i + 2 * a) * 4 * wd, 16 * h * wd, 4 * wd)


@njit(nogil=True, error_model="numpy", cache=True)
def _deconv_io(kernel, ctx, api, inputs, dx, dw, db):
    """Shared checks: (status, X, Wt, B, n, cin, h, wd, cout, block)."""
    none = (0, 0, 0, 0, 0, 0, 0, 0, 0)
    st = check_input_count(api, ctx, kernel, inputs)
    if st != 0:
        return (st, *none)
    st, px, rx = read_float_input(api, ctx, kernel, 0, dx)
    if st != 0:
        return (st, *none)
    st, pw, rw = read_float_input(api, ctx, kernel, 1, dw)
    if st != 0:
        return (st, *none)
    st, pb, rb = read_float_input(api, ctx, kernel, 2, db)
    if st != 0:
        return (st, *none)
    if rx != 4 or rw != 2 or rb != 1:
        return (fail(api, kernel, _T_SHAPES), *none)
    cin = load_i64(dx + 8)
    cout = load_i64(db)
    if load_i64(dw) != 4 * cout or load_i64(dw + 8) != cin:
        return (fail(api, kernel, _T_SHAPES), *none)
    block = slot_i64(kernel, DA_BLOCK)
    if block < 1 or block > MAX_BLOCK or cin % block != 0:
        return (fail(api, kernel, _T_BLOCK), *none)
    return 0, px, pw, pb, load_i64(dx), cin, load_i64(dx + 16), load_i64(dx + 24), cout, block


@njit(nogil=True, error_model="numpy", cache=True)
def _run(api, ctx, kernel, args, n, h, work):
    st = run_blocks(api, ctx, kernel, args, n * h, work)
    if st == 0 and load_i64(args + 8 * DG_FAILED) != 0:
        return fail(api, kernel, _T_MEMORY)
    return st


@njit(nogil=True, error_model="numpy", cache=True)
def _compute(kernel, ctx, chained, dx, dw, db, args):
    """Check X [N, Cin, H, W], Wt [4 * Cout, Cin], B [Cout], the block (and when ``chained`` W2t
    [4 * Cout2, Cout], B2 [Cout2]); allocate Y; one block per input row. dx, dw, db: DIMS_BYTES
    each, args: ARGS_BYTES, zeroed, of the caller's frame."""
    api = slot_api(kernel)
    st, px, pw, pb, n, cin, h, wd, cout, block = _deconv_io(kernel, ctx, api, 5 if chained else 3, dx, dw, db)
    if st != 0:
        return st
    up = 2
    cout_y = cout
    if chained:
        st, pw2, rw2 = read_float_input(api, ctx, kernel, 3, dw)
        if st != 0:
            return st
        st, pb2, rb2 = read_float_input(api, ctx, kernel, 4, db)
        if st != 0:
            return st
        cout_y = load_i64(db)
        if rw2 != 2 or rb2 != 1 or load_i64(dw) != 4 * cout_y or load_i64(dw + 8) != cout:
            return fail(api, kernel, _T_SHAPES2)
        up = 4
        store_i64(args + 8 * DG_W2, pw2)
        store_i64(args + 8 * DG_B2, pb2)
        store_i64(args + 8 * DG_COUT2, cout_y)
        store_i64(args + 8 * DG_ACT2, slot_i64(kernel, DA_ACT2 + 1) + 1 if slot_i64(kernel, DA_ACT2) > 0 else 0)
    store_i64(dx + 8, cout_y)
    store_i64(dx + 16, up * h)
    store_i64(dx + 24, up * wd)
    st, py = make_output(api, ctx, 0, dx, 4)
    if st != 0 or n * h * wd * cout_y == 0:
        return st
    for word, value in ((DG_SLOT, kernel), (DG_X, px), (DG_W, pw), (DG_B, pb), (DG_Y, py), (DG_CIN, cin),
                        (DG_COUT, cout), (DG_H, h), (DG_W_, wd), (DG_BLOCK, block),
                        (DG_ACT, 1 if slot_i64(kernel, DA_ACT) > 0 else 0)):
        store_i64(args + 8 * word, value)
    return _run(api, ctx, kernel, args, n, h, n * h * wd * cin * cout * 4 // 16)


def compute_deconv(kernel, ctx):
    return _compute(kernel, ctx, False, stack_bytes(DIMS_BYTES), stack_bytes(DIMS_BYTES), stack_bytes(DIMS_BYTES),
                    stack_bytes(ARGS_BYTES))


def compute_deconv2(kernel, ctx):
    return _compute(kernel, ctx, True, stack_bytes(DIMS_BYTES), stack_bytes(DIMS_BYTES), stack_bytes(DIMS_BYTES),
                    stack_bytes(ARGS_BYTES))


def _deconv_worker(args, block):
    cin = load_i64(args + 8 * DG_CIN)
    cout = load_i64(args + 8 * DG_COUT)
    cout2 = load_i64(args + 8 * DG_COUT2)
    h = load_i64(args + 8 * DG_H)
    wd = load_i64(args + 8 * DG_W_)
    wp, wp2 = padded(wd), padded(2 * wd)
    floats = (cin + 4 * cout) * wp + (2 * cout + 4 * cout2) * wp2 if cout2 > 0 else (cin + 4 * cout) * wp
    scratch = c_malloc(4 * floats)
    if scratch == 0:
        store_i64(args + 8 * DG_FAILED, 1)
        return
    image = block // h
    xa = load_i64(args + 8 * DG_X) + 4 * image * cin * h * wd
    lanes = load_i64(args + 8 * DG_BLOCK)
    act = load_i64(args + 8 * DG_ACT)
    if cout2 > 0:
        deconv2_row(xa, load_i64(args + 8 * DG_W), load_i64(args + 8 * DG_B), load_i64(args + 8 * DG_W2),
                    load_i64(args + 8 * DG_B2), load_i64(args + 8 * DG_Y) + 64 * image * cout2 * h * wd, cin, cout,
                    cout2, h, wd, block % h, lanes, act, load_i64(args + 8 * DG_ACT2), scratch)
    else:
        deconv_row(xa, load_i64(args + 8 * DG_W), load_i64(args + 8 * DG_B),
                   load_i64(args + 8 * DG_Y) + 16 * image * cout * h * wd, cin, cout, h, wd, block % h, lanes, act,
                   scratch)
    c_free(scratch)


NATIVE_OPS = (NativeOpDef(OP, ("X", "Wt", "B"), compute_deconv, _deconv_worker, attrs=ATTRS),
              NativeOpDef(OP2, ("X", "Wt", "B", "W2t", "B2"), compute_deconv2, _deconv_worker, attrs=ATTRS2))
