"""``FusedAttentionCore``: multi-head scaled dot-product attention from the packed Q|K|V projection,
one (batch, head) per work block, the scores held only for a block of query rows at a time
(docs/ARCHITECTURE.md §5).

Inputs, float32: QKV [B, S, 3 * H * d] (x @ W_qkv, the bias not yet added), Bias [3 * H * d], M an
additive mask of rank 4 that broadcasts to [B, H, S, S] (each dimension 1 or the full size: a
padding mask [B, 1, 1, S], a full [B, H, S, S], the zero [1, 1, 1, 1] of an attention without one).
Attributes: ``num_heads`` H, ``scale``. Output Y [B, S, H * d]:

    Q|K|V = QKV + Bias, split in three along the last axis, each viewed as [B, S, H, d]
    Y[b, i, h * d + e] = sum_j softmax_j(scale * Q[b, i, h] . K[b, j, h] + M[b, h, i, j]) V[b, j, h, e]

Any other rank, shape or head count is an ORT error status naming what was expected.

A work block copies its head's K transposed ([d, S]) and V ([S, d]) with the bias added, and its
rows of Q scaled; the products run on the register-blocked micro-kernel of
``custom_ops/kernels/winograd.py`` (4 rows x up to 3 vectors of 8 lanes); the softmax's
exponentials run on each row of scores while it is in cache, its normalization on the row of the
context.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.intrinsics import c_free, c_malloc, load_f64, load_i64, stack_bytes, store_f64, store_i64
from ortfuse.custom_ops.kernels.winograd import micro_gemm
from ortfuse.custom_ops.native.elementwise import f32_view
from ortfuse.custom_ops.native.inputs import check_input_count, fail, make_output, read_float_input
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.slots import slot_api, slot_f32, slot_i64
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import DIMS_BYTES
from ortfuse.custom_ops.status_messages import cstr
from ortfuse.custom_ops.vecmath import exp_f32

OP = "FusedAttentionCore"
WA_HEADS, WA_SCALE = 0, 1  # attribute words
ATTRS = (AttrDef("num_heads", "int", WA_HEADS), AttrDef("scale", "float", WA_SCALE))
LANES = 8  # vector width of the products (256-bit vectors run on every x86-64 level numba targets here)
ROWS = 4  # query rows per micro-kernel call
BLOCK_ROWS = 32  # query rows at a time: their scores [32, S] and Q rows stay within L2 beside K and V
# args block (int64 words)
(AC_QKV, AC_BIAS, AC_MASK, AC_Y, AC_B, AC_S, AC_H, AC_D, AC_SCALE, AC_FAILED, AC_MB, AC_MH, AC_MS, AC_MK) = range(14)
ARGS_BYTES = 8 * 14

_T_SHAPES = cstr("QKV must have the shape [batch, seq, 3 * hidden] with hidden a multiple of num_heads, "
                 "Bias [3 * hidden], and M rank 4 broadcasting to [batch, num_heads, seq, seq]")
_T_MEMORY = cstr("could not allocate the scratch buffer of a block of query rows")


@njit(nogil=True, error_model="numpy", cache=True)
def _round_up(n, m):
    return (n + m - 1) // m * m


@njit(nogil=True, error_model="numpy", cache=True)
def _products(a, lda, b, ldb, c, ldc, depth, rows, cols):
    """C[rows, cols] = A[rows, depth] @ B[depth, cols] (addresses, row strides in floats; rows a
    multiple of ROWS, cols of LANES)."""
    for r in range(0, rows, ROWS):
        n0 = 0
        while n0 < cols:
            left = (cols - n0) // LANES
            at_b = b + 4 * n0
            at_c = c + 4 * (r * ldc + n0)
            if left >= 3 and left != 4:  # four vectors as two and two: a one-vector call is load-bound
                micro_gemm(a + 4 * r * lda, lda, at_b, ldb, at_c, ldc, depth, 4, 3, 8)
                n0 += 3 * LANES
            elif left >= 2:
                micro_gemm(a + 4 * r * lda, lda, at_b, ldb, at_c, ldc, depth, 4, 2, 8)
                n0 += 2 * LANES
            else:
                micro_gemm(a + 4 * r * lda, lda, at_b, ldb, at_c, ldc, depth, 4, 1, 8)
                n0 += LANES


@njit(nogil=True, error_model="numpy", cache=True, fastmath={"reassoc"})
def _exp_sum(row, top):
    """row = exp(row - top); returns the sum. Only the sum may be reassociated (so that it
    vectorizes with the exponentials); each exponential keeps vecmath's float32 steps."""
    total = np.float32(0.0)
    for k in range(row.shape[0]):
        e = exp_f32(row[k] - top)
        row[k] = e
        total += e
    return total


@njit(nogil=True, error_model="numpy", cache=True)
def _exp_row(row, mask, at, per_key):
    """row = exp(row + m - max_j(row + m)) with m = mask[at + j] (per_key) or mask[at]; returns
    1 / sum_j row[j], the softmax's normalization (applied to the context row instead). The maximum
    keeps eight partial values, so that no single dependency chain runs the row."""
    s = row.shape[0]
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.float32(-np.inf)
    mv = mask[at]
    j = 0
    if per_key:
        mr = mask[at:at + s]  # slices here and below: indices numba knows are >= 0, so loops vectorize
        while j + 8 <= s:
            for k in range(j, j + 8):
                row[k] += mr[k]
            m0, m1, m2, m3 = max(m0, row[j]), max(m1, row[j + 1]), max(m2, row[j + 2]), max(m3, row[j + 3])
            m4, m5, m6, m7 = max(m4, row[j + 4]), max(m5, row[j + 5]), max(m6, row[j + 6]), max(m7, row[j + 7])
            j += 8
        for k in range(j, s):
            row[k] += mr[k]
    else:
        if mv != 0:  # one value for the whole row: added as ORT adds it (it can round every score to it)
            for k in range(s):
                row[k] += mv
        while j + 8 <= s:
            m0, m1, m2, m3 = max(m0, row[j]), max(m1, row[j + 1]), max(m2, row[j + 2]), max(m3, row[j + 3])
            m4, m5, m6, m7 = max(m4, row[j + 4]), max(m5, row[j + 5]), max(m6, row[j + 6]), max(m7, row[j + 7])
            j += 8
    top = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
    for k in range(j, s):
        top = max(top, row[k])
    total = _exp_sum(row, top)
    return np.float32(1.0) / total


@njit(nogil=True, error_model="numpy", cache=True)
def scratch_floats(s, d):
    """Floats of one block's scratch: K^T [d, Sp], V [S, dp] (used when d is not a multiple of
    LANES), Q [BLOCK_ROWS, d], scores [BLOCK_ROWS, Sp], context [BLOCK_ROWS, dp], the rows'
    normalizations [BLOCK_ROWS] (Sp, dp: S and d rounded up to LANES)."""
    sp = _round_up(s, LANES)
    dp = _round_up(d, LANES)
    return d * sp + s * dp + BLOCK_ROWS * (d + sp + dp + 1)


@njit(nogil=True, error_model="numpy", cache=True)
def attend(qkv_a, qkv, bias, mask, y, s, heads, d, scale, b, h, mb, mh, ms, mk, scratch):
    """Head h of batch b, in blocks of BLOCK_ROWS query rows (qkv, bias, mask, y: float32 arrays of
    the whole tensors, qkv_a the address of qkv; mb, mh, ms, mk: M's four dimensions). With d a
    multiple of LANES the product with V reads V where it is, and V's bias is added to the output
    rows (the probabilities sum to 1)."""
    hd = heads * d
    sp = _round_up(s, LANES)
    dp = _round_up(d, LANES)
    kt_a = scratch
    v_a = kt_a + 4 * d * sp
    q_a = v_a + 4 * s * dp
    sc_a = q_a + 4 * BLOCK_ROWS * d
    cx_a = sc_a + 4 * BLOCK_ROWS * sp
    kt = f32_view(kt_a, d * sp)
    v = f32_view(v_a, s * dp)
    q = f32_view(q_a, BLOCK_ROWS * d)
    sc = f32_view(sc_a, BLOCK_ROWS * sp)
    cx = f32_view(cx_a, BLOCK_ROWS * dp)
    inv = f32_view(cx_a + 4 * BLOCK_ROWS * dp, BLOCK_ROWS)
    row0 = b * s * 3 * hd
    direct = d == dp
    bq, bk, bv = bias[h * d:h * d + d], bias[hd + h * d:hd + h * d + d], bias[2 * hd + h * d:2 * hd + h * d + d]
    for j in range(s):
        at = row0 + j * 3 * hd + h * d
        kj = qkv[at + hd:at + hd + d]
        for e in range(d):
            kt[e * sp + j] = kj[e] + bk[e]
        if not direct:
            vj, vr = qkv[at + 2 * hd:at + 2 * hd + d], v[j * dp:j * dp + dp]
            for e in range(d):
                vr[e] = vj[e] + bv[e]
            for e in range(d, dp):
                vr[e] = np.float32(0.0)
    v_src, ldv = (qkv_a + 4 * (row0 + 2 * hd + h * d), 3 * hd) if direct else (v_a, dp)
    for e in range(d):
        for j in range(s, sp):
            kt[e * sp + j] = np.float32(0.0)
    m_head = (b if mb > 1 else 0) * mh * ms * mk + (h if mh > 1 else 0) * ms * mk
    for r0 in range(0, s, BLOCK_ROWS):
        rows = min(BLOCK_ROWS, s - r0)
        rp = _round_up(rows, ROWS)
        for r in range(rp):
            qr = q[r * d:r * d + d]
            if r < rows:
                at = row0 + (r0 + r) * 3 * hd + h * d
                qi = qkv[at:at + d]
                for e in range(d):
                    qr[e] = (qi[e] + bq[e]) * scale
            else:
                qr[:] = np.float32(0.0)
        _products(q_a, d, kt_a, sp, sc_a, sp, d, rp, sp)
        for r in range(rows):
            inv[r] = _exp_row(sc[r * sp:r * sp + s], mask, m_head + ((r0 + r) if ms > 1 else 0) * mk, mk > 1)
        _products(sc_a, sp, v_src, ldv, cx_a, dp, s, rp, dp)
        for r in range(rows):
            at = (b * s + r0 + r) * hd + h * d
            yr, cr, ir = y[at:at + d], cx[r * dp:r * dp + d], inv[r]
            if direct:
                for e in range(d):
                    yr[e] = cr[e] * ir + bv[e]
            else:
                for e in range(d):
                    yr[e] = cr[e] * ir


def compute_attention_core(kernel, ctx):
    """Check QKV [B, S, 3Hd], Bias [3Hd], M (rank 4, broadcasting); allocate Y [B, S, Hd]; run the blocks."""
    api = slot_api(kernel)
    st = check_input_count(api, ctx, kernel, 3)
    if st != 0:
        return st
    dq = stack_bytes(DIMS_BYTES)
    db = stack_bytes(DIMS_BYTES)
    dm = stack_bytes(DIMS_BYTES)
    st, pq, rq = read_float_input(api, ctx, kernel, 0, dq)
    if st != 0:
        return st
    st, pb, rb = read_float_input(api, ctx, kernel, 1, db)
    if st != 0:
        return st
    st, pm, rm = read_float_input(api, ctx, kernel, 2, dm)
    if st != 0:
        return st
    if rq != 3 or rb != 1 or rm != 4:
        return fail(api, kernel, _T_SHAPES)
    batch = load_i64(dq)
    s = load_i64(dq + 8)
    width = load_i64(dq + 16)
    heads = slot_i64(kernel, WA_HEADS)
    if heads <= 0 or width % (3 * heads) != 0 or width == 0 or load_i64(db) != width:
        return fail(api, kernel, _T_SHAPES)
    for axis, full in ((0, batch), (1, heads), (2, s), (3, s)):
        dim = load_i64(dm + 8 * axis)
        if dim != 1 and dim != full:
            return fail(api, kernel, _T_SHAPES)
    d = width // (3 * heads)
    store_i64(dq + 16, heads * d)
    st, py = make_output(api, ctx, 0, dq, 3)
    if st != 0 or batch * s == 0:
        return st
    args = stack_bytes(ARGS_BYTES)
    for word, value in ((AC_QKV, pq), (AC_BIAS, pb), (AC_MASK, pm), (AC_Y, py), (AC_B, batch), (AC_S, s),
                        (AC_H, heads), (AC_D, d), (AC_MB, load_i64(dm)),
                        (AC_MH, load_i64(dm + 8)), (AC_MS, load_i64(dm + 16)), (AC_MK, load_i64(dm + 24))):
        store_i64(args + 8 * word, value)
    store_i64(args + 8 * AC_FAILED, 0)
    store_f64(args + 8 * AC_SCALE, np.float64(slot_f32(kernel, WA_SCALE)))
    # cost in elementwise-equivalent units: multiply-adds of both products / 16
    st = run_blocks(api, ctx, kernel, args, batch * heads, batch * heads * s * s * d * 2 // 16)
    if st == 0 and load_i64(args + 8 * AC_FAILED) != 0:
        return fail(api, kernel, _T_MEMORY)
    return st


def _attention_worker(args, block):
    batch = load_i64(args + 8 * AC_B)
    s = load_i64(args + 8 * AC_S)
    heads = load_i64(args + 8 * AC_H)
    d = load_i64(args + 8 * AC_D)
    b = block // heads
    h = block % heads
    mb = load_i64(args + 8 * AC_MB)
    mh = load_i64(args + 8 * AC_MH)
    ms = load_i64(args + 8 * AC_MS)
    mk = load_i64(args + 8 * AC_MK)
    scratch = c_malloc(4 * scratch_floats(s, d))
    if scratch == 0:
        store_i64(args + 8 * AC_FAILED, 1)
        return
    hd = heads * d
    qkv = f32_view(load_i64(args + 8 * AC_QKV), batch * s * 3 * hd)
    bias = f32_view(load_i64(args + 8 * AC_BIAS), 3 * hd)
    mask = f32_view(load_i64(args + 8 * AC_MASK), mb * mh * ms * mk)
    y = f32_view(load_i64(args + 8 * AC_Y), batch * s * hd)
    scale = np.float32(load_f64(args + 8 * AC_SCALE))
    attend(load_i64(args + 8 * AC_QKV), qkv, bias, mask, y, s, heads, d, scale, b, h, mb, mh, ms, mk, scratch)
    c_free(scratch)


NATIVE_OPS = (NativeOpDef(OP, ("QKV", "Bias", "M"), compute_attention_core, _attention_worker, attrs=ATTRS),)
