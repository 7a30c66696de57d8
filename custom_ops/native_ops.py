"""Compute callbacks and workers of the native fused ops, and the table ``NATIVE_OPS``.

Each op has:

* *span kernels* (``@njit``): the math on contiguous float32 arrays over ``[start, end)``
  (``add_relu_span``, ``hardswish_span``, ``silu_span``, ``gemm_rows``). They are the swap points
  for faster kernels (e.g. vectorised float32 math): replace the function or its import *in this
  file*. Do not monkeypatch them at run time: compiled code is cached on disk and stamped with this
  package's source files, so only a source change recompiles the callers.
  The math is the vectorised float32 math of ``kernels/eltwise.py`` (its element functions, built on
  ``vecmath``), inlined into loops over slices that start at index 0 so that LLVM vectorises them;
  spans use ``error_model="numpy"`` (no zero-division branch to block vectorising, and a division
  by zero gives +-Inf/NaN like the reference). They stay serial: the blocks are the parallelism.
* a *worker* ``(args, block) -> None``, compiled as a ``void(void*, size_t)`` cfunc: unpacks the
  args block the compute filled and runs the span kernel on one block.
* a *compute* ``(kernel, ctx) -> OrtStatus*``, shared by an op family (``_compute_unary``,
  ``_compute_binary``): checks input count, element types, ranks and shapes, returns a status with
  a one-sentence message on any mismatch, allocates the output, fills the args block and hands the
  blocks to ``native.run_blocks`` (serial, ORT's thread pool or numba's, see
  ``native.set_threading``). Nothing reads or writes outside the tensors ORT gave it.

Op types are ``OpSpec.name`` (``FusedAddRelu``...), never the Python-op ``...Ref`` names.
``FusedGemmAct`` reads its ``activation`` string once in CreateKernel as '+'-joined tokens from
``GEMM_ACTIVATIONS`` (``""`` or absent = none); any other token makes session creation fail with a
message naming the accepted tokens.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit
from ortfuse.custom_ops import abi
from ortfuse.custom_ops.abi import (
    cstr,
    int_to_voidptr,
    load_i64,
    msg_put,
    msg_put_dims,
    msg_status,
    prefetch_lines,
    stack_bytes,
    store_i64,
)
from ortfuse.custom_ops.kernels.eltwise import _clip1, _gelu1, _gelu_tanh1, _relu1
from ortfuse.custom_ops.native import (
    DIMS_BYTES,
    MAX_RANK,
    MSG_CAP,
    AttrDef,
    NativeOpDef,
    check_input_count,
    element_count,
    fail,
    make_output,
    msg_begin,
    read_float_input,
    read_input,
    run_blocks,
    slot_api,
    slot_f32,
    slot_i64,
)
from ortfuse.custom_ops.vecmath import always_inline, from_f32, prefer_512bit, silu_f32, to_f32

BLOCK = 1 << 14  # elements per block (the unit of work handed to a thread)
PIECE = 256      # the unary spans run in pieces this long, each after hinting the lines AHEAD elements on
AHEAD = 1024
HINT_MIN = 1 << 18  # tensors shorter than this (1 MiB of float32) get no hints (hint_plan)
# stack buffer sizes (stack_bytes needs module constants, not expressions)
ADD_RELU_SCRATCH = 8 * (3 * MAX_RANK + 1 + 3 * MAX_RANK)
GEMM_SCRATCH = 4 * DIMS_BYTES

_T_AND = cstr(" and ")
_T_NO_BROADCAST = cstr("input shapes ")
_T_NO_BROADCAST2 = cstr(" do not broadcast")


@njit(cache=True)
def _f32_view(addr, n):
    return carray(int_to_voidptr(addr), (n,), np.float32)


# --------------------------------------------------------------------------------------------------
# Broadcasting of two inputs (numpy rules), reduced to rows: out = rows x inner
# --------------------------------------------------------------------------------------------------


@njit(cache=True)
def broadcast_dims(da, ra, db, rb, do):
    """Write the numpy broadcast of two shapes at ``do``; returns its rank, or -1 if they do not broadcast."""
    ro = max(ra, rb)
    for k in range(ro):
        ia = ra - ro + k
        ib = rb - ro + k
        a = load_i64(da + 8 * ia) if ia >= 0 else np.int64(1)
        b = load_i64(db + 8 * ib) if ib >= 0 else np.int64(1)
        if a == b or b == 1:
            store_i64(do + 8 * k, a)
        elif a == 1:
            store_i64(do + 8 * k, b)
        else:
            return -1
    return ro


@njit(cache=True)
def broadcast_plan(da, ra, db, rb, do, ro, plan):
    """Collapse the broadcast into dims where each input either follows the output or repeats.

    Writes at ``plan`` (int64 words): [0] = number of collapsed dims m, then m triples
    (extent, stride of A, stride of B) from outermost to innermost, strides in elements (0 = repeat).
    Adjacent dims merge when both inputs are contiguous across them or repeat across both.
    """
    m = 0
    sa = np.int64(1)
    sb = np.int64(1)
    # walk from the innermost dim outwards, building collapsed dims innermost-first at plan+8
    for k in range(ro - 1, -1, -1):
        ia = ra - ro + k
        ib = rb - ro + k
        ext = load_i64(do + 8 * k)
        a = load_i64(da + 8 * ia) if ia >= 0 else np.int64(1)
        b = load_i64(db + 8 * ib) if ib >= 0 else np.int64(1)
        if ext == 1:
            continue
        stride_a = sa if a == ext else np.int64(0)
        stride_b = sb if b == ext else np.int64(0)
        if m > 0:
            base = plan + 8 * (1 + 3 * (m - 1))
            pe = load_i64(base)
            psa = load_i64(base + 8)
            psb = load_i64(base + 16)
            ok_a = (stride_a == 0 and psa == 0) or (stride_a != 0 and psa != 0 and stride_a == psa * pe)
            ok_b = (stride_b == 0 and psb == 0) or (stride_b != 0 and psb != 0 and stride_b == psb * pe)
            if ok_a and ok_b:
                store_i64(base, pe * ext)
                if a == ext:
                    sa *= a
                if b == ext:
                    sb *= b
                continue
        base = plan + 8 * (1 + 3 * m)
        store_i64(base, ext)
        store_i64(base + 8, stride_a)
        store_i64(base + 16, stride_b)
        m += 1
        if a == ext:
            sa *= a
        if b == ext:
            sb *= b
    # reverse to outermost-first
    for i in range(m // 2):
        x = plan + 8 * (1 + 3 * i)
        y = plan + 8 * (1 + 3 * (m - 1 - i))
        for w in range(3):
            t = load_i64(x + 8 * w)
            store_i64(x + 8 * w, load_i64(y + 8 * w))
            store_i64(y + 8 * w, t)
    store_i64(plan, m)
    return m


@njit(cache=True)
def broadcast_error(api, slot, da, ra, db, rb):
    buf = stack_bytes(MSG_CAP)
    n = msg_begin(buf, slot)
    n = msg_put(buf, MSG_CAP, n, _T_NO_BROADCAST)
    n = msg_put_dims(buf, MSG_CAP, n, da, ra)
    n = msg_put(buf, MSG_CAP, n, _T_AND)
    n = msg_put_dims(buf, MSG_CAP, n, db, rb)
    n = msg_put(buf, MSG_CAP, n, _T_NO_BROADCAST2)
    # ORT_FAIL, as stock ORT's Add reports a broadcast mismatch (ORT_ENFORCE): same exception type
    return msg_status(api, abi.ORT_FAIL, buf, n)


@njit(cache=True)
def row_offsets(plan, m, row):
    """Element offsets of A and B at the start of outer row ``row`` (all collapsed dims but the last)."""
    oa = np.int64(0)
    ob = np.int64(0)
    r = row
    for d in range(m - 2, -1, -1):
        base = plan + 8 * (1 + 3 * d)
        ext = load_i64(base)
        i = r % ext
        r //= ext
        oa += i * load_i64(base + 8)
        ob += i * load_i64(base + 16)
    return oa, ob


# --------------------------------------------------------------------------------------------------
# FusedAddRelu: relu(A + B), numpy broadcasting
# --------------------------------------------------------------------------------------------------


@njit(nogil=True, error_model="numpy", cache=True)
def add_relu_span(a, b, o, oa, sa, ob, sb, oo, n):
    """o[oo:oo+n] = relu(a[oa + i*sa] + b[ob + i*sb]) with strides 0 or 1; NaN propagates, -0 -> 0.
    Arrays of float32, or of float16 bits (uint16: the sum in float32, rounded to float16 once).

    Loops index slices from 0 (not ``a[oa + i]``): numba then drops its negative-index wraparound
    and LLVM vectorises the loop, 2-4x faster here.
    """
    out = o[oo:oo + n]
    if sa == 1 and sb == 1:
        aa = a[oa:oa + n]
        bb = b[ob:ob + n]
        for i in range(n):
            out[i] = from_f32(_relu1(to_f32(aa[i]) + to_f32(bb[i])), out)
    elif sa == 1:
        aa = a[oa:oa + n]
        bv = to_f32(b[ob])
        for i in range(n):
            out[i] = from_f32(_relu1(to_f32(aa[i]) + bv), out)
    elif sb == 1:
        bb = b[ob:ob + n]
        av = to_f32(a[oa])
        for i in range(n):
            out[i] = from_f32(_relu1(av + to_f32(bb[i])), out)
    else:
        r = from_f32(_relu1(to_f32(a[oa]) + to_f32(b[ob])), out)
        for i in range(n):
            out[i] = r


@njit(cache=True)
def add_relu_rows(a, b, o, plan, m, row0, row1):
    inner = load_i64(plan + 8 * (1 + 3 * (m - 1)))
    isa = load_i64(plan + 8 * (1 + 3 * (m - 1)) + 8)
    isb = load_i64(plan + 8 * (1 + 3 * (m - 1)) + 16)
    for row in range(row0, row1):
        oa, ob = row_offsets(plan, m, row)
        add_relu_span(a, b, o, oa, isa, ob, isb, row * inner, inner)


# args block of the broadcasting binary family (int64 words)
BA_SLOT, BA_A, BA_B, BA_O, BA_NA, BA_NB, BA_N, BA_PLAN, BA_M, BA_ROWS, BA_RPB, BA_INNER = range(12)
BINARY_ARGS_BYTES = 8 * 16


def _compute_binary(kernel, ctx):
    """Compute of two float32 inputs with numpy broadcasting into one output of the broadcast shape;
    the op's worker does the math on blocks of rows (or of the inner dim when there is one row)."""
    api = slot_api(kernel)
    st = check_input_count(api, ctx, kernel, 2)
    if st != 0:
        return st
    dims = stack_bytes(ADD_RELU_SCRATCH)
    da = dims
    db = dims + DIMS_BYTES
    do = dims + 2 * DIMS_BYTES
    plan = dims + 3 * DIMS_BYTES
    st, pa, ra = read_float_input(api, ctx, kernel, 0, da)
    if st != 0:
        return st
    st, pb, rb = read_float_input(api, ctx, kernel, 1, db)
    if st != 0:
        return st
    ro = broadcast_dims(da, ra, db, rb, do)
    if ro < 0:
        return broadcast_error(api, kernel, da, ra, db, rb)
    st, po = make_output(api, ctx, 0, do, ro)
    if st != 0:
        return st
    n = element_count(do, ro)
    if n == 0:
        return 0
    m = broadcast_plan(da, ra, db, rb, do, ro, plan)
    if m == 0:  # every dim is 1: one element
        store_i64(plan, 1)
        store_i64(plan + 8, 1)
        store_i64(plan + 16, 0)
        store_i64(plan + 24, 0)
        m = 1
    inner = load_i64(plan + 8 * (1 + 3 * (m - 1)))
    rows = n // inner
    if rows == 1:
        rpb = 0
        nblocks = (inner + BLOCK - 1) // BLOCK
    else:
        rpb = max(1, BLOCK // inner)
        nblocks = (rows + rpb - 1) // rpb
    args = stack_bytes(BINARY_ARGS_BYTES)
    store_i64(args + 8 * BA_SLOT, kernel)
    store_i64(args + 8 * BA_A, pa)
    store_i64(args + 8 * BA_B, pb)
    store_i64(args + 8 * BA_O, po)
    store_i64(args + 8 * BA_NA, element_count(da, ra))
    store_i64(args + 8 * BA_NB, element_count(db, rb))
    store_i64(args + 8 * BA_N, n)
    store_i64(args + 8 * BA_PLAN, plan)
    store_i64(args + 8 * BA_M, m)
    store_i64(args + 8 * BA_ROWS, rows)
    store_i64(args + 8 * BA_RPB, rpb)
    store_i64(args + 8 * BA_INNER, inner)
    return run_blocks(api, ctx, kernel, args, nblocks, n)


@njit(nogil=True, cache=True)
def add_relu_block(a, b, o, args, block):
    """Block ``block`` of a FusedAddRelu compute (the args block ``_compute_binary`` filled) on the
    views a, b, o: float32, or float16 bits (native_f16)."""
    plan = load_i64(args + 8 * BA_PLAN)
    m = load_i64(args + 8 * BA_M)
    rpb = load_i64(args + 8 * BA_RPB)
    if rpb == 0:  # one row: this block is a slice of it
        inner = load_i64(args + 8 * BA_INNER)
        isa = load_i64(plan + 8 * (1 + 3 * (m - 1)) + 8)
        isb = load_i64(plan + 8 * (1 + 3 * (m - 1)) + 16)
        s = block * BLOCK
        add_relu_span(a, b, o, s * isa, isa, s * isb, isb, s, min(inner, s + BLOCK) - s)
    else:
        rows = load_i64(args + 8 * BA_ROWS)
        add_relu_rows(a, b, o, plan, m, block * rpb, min(rows, (block + 1) * rpb))


def _add_relu_worker(args, block):
    add_relu_block(_f32_view(load_i64(args + 8 * BA_A), load_i64(args + 8 * BA_NA)),
                   _f32_view(load_i64(args + 8 * BA_B), load_i64(args + 8 * BA_NB)),
                   _f32_view(load_i64(args + 8 * BA_O), load_i64(args + 8 * BA_N)), args, block)


# --------------------------------------------------------------------------------------------------
# Unary elementwise ops: FusedHardSwish, FusedSiLU
# --------------------------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def hint_plan(n, s, e):
    """(limit, step) of a span [s, e) of an n-element tensor: hints below ``limit`` in pieces of ``step``.
    A tensor shorter than HINT_MIN fits in L2 with its output: no hints, one piece (pieces and hints
    cost 5% there: 64K-float SiLU 15.7 -> 16.5 us)."""
    always_inline()
    if n >= HINT_MIN:
        return e, PIECE
    return s, max(e - s, 1)


@njit(nogil=True, cache=True)
def hint_ahead(xa, ya, size, p, q, e):
    """Cache hints for elements [p, q) + AHEAD (below e) of the arrays at xa (read) and ya (write),
    of ``size``-byte elements, before a span's piece [p, q) is computed. A loop with a division or
    exp per element issues its loads too slowly for the hardware prefetcher to hide memory latency;
    these keep main memory busy (32M float16 SiLU, 1 thread, pure-numba model: 15.1 -> 9.6 ms;
    float32 15.8 -> 14.5 ms, a copy 15.7). Inlined, and given addresses: a call per piece, or
    arrays passed to the inlined function, cost 2.3 ms of those 32M."""
    always_inline()
    lo = p + AHEAD
    hi = min(q + AHEAD, e)
    if lo < hi:
        prefetch_lines(xa + size * lo, size * (hi - lo), False)
        prefetch_lines(ya + size * lo, size * (hi - lo), True)


@njit(nogil=True, error_model="numpy", cache=True)
def hardswish_span(x, y, s, e, add, lo, hi, div):
    """y = x * (clip(x + add, lo, hi) / div) in float32; clip as np.minimum(np.maximum(.)): NaN in the
    value or a bound gives NaN, ties give the bound (eltwise.hardswish, bit-identical to the reference)."""
    limit, step = hint_plan(x.shape[0], s, e)
    for p in range(s, e, step):
        q = min(p + step, e)
        hint_ahead(x.ctypes.data, y.ctypes.data, x.itemsize, p, q, limit)
        xs = x[p:q]
        ys = y[p:q]
        for i in range(xs.shape[0]):
            v = xs[i]
            ys[i] = v * (_clip1(v + add, lo, hi) / div)


@njit(nogil=True, error_model="numpy", cache=True)
def silu_span(x, y, s, e):
    """y = x * sigmoid(x) in float32 with vecmath's silu_f32 (as eltwise.silu: a few ulp from the
    reference's x * (1 / (1 + exp(-x))); -0 below x = -88.38, where the exact value is above -3.7e-37).
    x and y of float32, or of float16 bits (uint16: widened, rounded to float16 once)."""
    prefer_512bit()
    limit, step = hint_plan(x.shape[0], s, e)
    for p in range(s, e, step):
        q = min(p + step, e)
        hint_ahead(x.ctypes.data, y.ctypes.data, x.itemsize, p, q, limit)
        xs = x[p:q]
        ys = y[p:q]
        for i in range(xs.shape[0]):
            ys[i] = from_f32(silu_f32(to_f32(xs[i])), ys)


# args block of the unary family (int64 words)
UA_SLOT, UA_X, UA_Y, UA_N = range(4)
UNARY_ARGS_BYTES = 8 * 4


def _compute_unary(kernel, ctx):
    """Compute of one float32 input into a same-shape output, in blocks of BLOCK elements."""
    api = slot_api(kernel)
    st = check_input_count(api, ctx, kernel, 1)
    if st != 0:
        return st
    dims = stack_bytes(DIMS_BYTES)
    st, px, rx = read_float_input(api, ctx, kernel, 0, dims)
    if st != 0:
        return st
    st, py = make_output(api, ctx, 0, dims, rx)
    if st != 0:
        return st
    n = element_count(dims, rx)
    if n == 0:
        return 0
    args = stack_bytes(UNARY_ARGS_BYTES)
    store_i64(args + 8 * UA_SLOT, kernel)
    store_i64(args + 8 * UA_X, px)
    store_i64(args + 8 * UA_Y, py)
    store_i64(args + 8 * UA_N, n)
    return run_blocks(api, ctx, kernel, args, (n + BLOCK - 1) // BLOCK, n)


@njit(cache=True)
def unary_block(args, block):
    """(slot, x, y, start, end) of one block of a unary compute."""
    n = load_i64(args + 8 * UA_N)
    x = _f32_view(load_i64(args + 8 * UA_X), n)
    y = _f32_view(load_i64(args + 8 * UA_Y), n)
    s = block * BLOCK
    return load_i64(args + 8 * UA_SLOT), x, y, s, min(n, s + BLOCK)


# attribute words of FusedHardSwish
HS_ADD, HS_LO, HS_HI, HS_DIV = 0, 1, 2, 3


def _hardswish_worker(args, block):
    slot, x, y, s, e = unary_block(args, block)
    hardswish_span(x, y, s, e, slot_f32(slot, HS_ADD), slot_f32(slot, HS_LO), slot_f32(slot, HS_HI),
                   slot_f32(slot, HS_DIV))


def _silu_worker(args, block):
    _slot, x, y, s, e = unary_block(args, block)
    silu_span(x, y, s, e)


# --------------------------------------------------------------------------------------------------
# FusedGemmAct: act(X[..., K] @ W[K, N] + B[N])
# --------------------------------------------------------------------------------------------------

GEMM_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
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
    """Apply the activation steps (codes of GEMM_ACTIVATIONS) to y[s:e] in place, as reference.activation,
    with eltwise's element functions (gelu, gelu_tanh, silu through vecmath: a few ulp from the
    reference; relu exact). One vectorised loop per step, the switch outside the loops."""
    prefer_512bit()
    ys = y[s:e]
    for k in range(steps):
        c = codes[k]
        if c == ACT_RELU:
            for i in range(ys.shape[0]):
                ys[i] = _relu1(ys[i])
        elif c == ACT_GELU:
            for i in range(ys.shape[0]):
                ys[i] = _gelu1(ys[i])
        elif c == ACT_GELU_TANH:
            for i in range(ys.shape[0]):
                ys[i] = _gelu_tanh1(ys[i])
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
    x = _f32_view(load_i64(args + 8 * GA_X), m * k)
    w = _f32_view(load_i64(args + 8 * GA_W), k * n)
    b = _f32_view(load_i64(args + 8 * GA_B), n)
    y = _f32_view(load_i64(args + 8 * GA_Y), m * n)
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
    return msg_status(api, abi.ORT_INVALID_ARGUMENT, buf, n)


@njit(cache=True)
def gemm_io(api, ctx, kernel, dims):
    """Inputs and output of FusedGemmAct (and its bf16 variant, native_amx.py), checked: (status, x,
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


# --------------------------------------------------------------------------------------------------
# OrtfuseAbiProbe: a test op that reports what the ABI sees (tests/test_native_abi.py)
# --------------------------------------------------------------------------------------------------

PROBE_OUT = 40
PROBE_CHOICES = ("alpha", "beta", "gamma")
PR_F, PR_I, PR_S, PR_FO, PR_IO, PR_MODE = 0, 1, 2, 6, 7, 8   # attribute words (s takes 1 + 3)
_T_PROBE_FAIL = cstr("failure requested by attribute mode=1")
_T_PROBE_MSG = cstr("probe message")


def _compute_probe(kernel, ctx):
    """Output float64[40]: [0] input count, [1] output count, [2] X element type, [3] X rank,
    [4:12] X dims, [12] Y element type, [13] Y rank, [14:22] Y dims, [22] f, [23] i, [24] steps of s,
    [25:28] codes of s, [28] fo, [29] io, [30] error code and [31] message length read back from a
    status made with CreateStatus, [32] its first byte, [33] element count and [34] element type of a
    tensor made with CreateTensorAsOrtValue, [35] sum of X if float32, [36] mode."""
    api = slot_api(kernel)
    if slot_i64(kernel, PR_MODE) == 1:
        return fail(api, kernel, _T_PROBE_FAIL)
    tmp = stack_bytes(64)
    dims = stack_bytes(DIMS_BYTES)
    out_dims = stack_bytes(8)
    store_i64(out_dims, PROBE_OUT)
    st, po = make_output(api, ctx, 0, out_dims, 1)
    if st != 0:
        return st
    o = carray(int_to_voidptr(po), (PROBE_OUT,), np.float64)
    for i in range(PROBE_OUT):
        o[i] = -1.0
    st = abi.context_input_count(api, ctx, tmp)
    if st != 0:
        return st
    o[0] = load_i64(tmp)
    st = abi.context_output_count(api, ctx, tmp)
    if st != 0:
        return st
    o[1] = load_i64(tmp)
    sum_x = -1.0
    for inp in range(2):
        st, pd, et, rank = read_input(api, ctx, inp, dims)
        if st != 0:
            return st
        base = 2 + 10 * inp
        o[base] = et
        o[base + 1] = rank
        for d in range(min(rank, 8)):
            o[base + 2 + d] = load_i64(dims + 8 * d)
        if inp == 0 and et == abi.ONNX_TYPE_FLOAT and rank <= MAX_RANK:
            cnt = element_count(dims, rank)
            xs = _f32_view(pd, cnt)
            sum_x = 0.0
            for i in range(cnt):
                sum_x += xs[i]
    o[22] = slot_f32(kernel, PR_F)
    o[23] = slot_i64(kernel, PR_I)
    steps = slot_i64(kernel, PR_S)
    o[24] = steps
    for s in range(3):
        o[25 + s] = slot_i64(kernel, PR_S + 1 + s) if s < steps else -1
    o[28] = slot_f32(kernel, PR_FO)
    o[29] = slot_i64(kernel, PR_IO)
    # CreateStatus -> GetErrorCode / GetErrorMessage -> ReleaseStatus
    buf = stack_bytes(64)
    n = msg_put(buf, 64, 0, _T_PROBE_MSG)
    status = msg_status(api, abi.ORT_NOT_IMPLEMENTED, buf, n)
    o[30] = abi.get_error_code(api, status)
    msg = abi.get_error_message(api, status)
    length = 0
    while abi.load_u8(msg + length) != 0 and length < 1000:
        length += 1
    o[31] = length
    o[32] = abi.load_u8(msg)
    abi.release_status(api, status)
    # GetAllocatorWithDefaultOptions -> CreateTensorAsOrtValue -> GetTensorMutableData ->
    # GetTensorTypeAndShape -> GetTensorShapeElementCount / GetTensorElementType -> ReleaseValue
    st = abi.get_allocator_with_default_options(api, tmp)
    if st != 0:
        return st
    alloc = load_i64(tmp)
    tdims = stack_bytes(24)
    store_i64(tdims, 2)
    store_i64(tdims + 8, 3)
    store_i64(tdims + 16, 4)
    st = abi.create_tensor_as_ort_value(api, alloc, tdims, 3, abi.ONNX_TYPE_FLOAT, tmp)
    if st != 0:
        return st
    value = load_i64(tmp)
    st = abi.get_tensor_mutable_data(api, value, tmp + 8)
    if st == 0:
        t = _f32_view(load_i64(tmp + 8), 24)
        for i in range(24):
            t[i] = i
    if st == 0:
        st = abi.get_tensor_type_and_shape(api, value, tmp + 16)
    if st == 0:
        info = load_i64(tmp + 16)
        store_i64(tmp + 24, 0)
        st = abi.get_tensor_shape_element_count(api, info, tmp + 24)
        o[33] = load_i64(tmp + 24)
        store_i64(tmp + 32, 0)
        if st == 0:
            st = abi.get_tensor_element_type(api, info, tmp + 32)
            o[34] = abi.load_i32(tmp + 32)
        abi.release_tensor_type_and_shape_info(api, info)
    abi.release_value(api, value)
    if st != 0:
        return st
    o[35] = sum_x
    o[36] = slot_i64(kernel, PR_MODE)
    return 0


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------


def _f(name, slot, **kw):
    return AttrDef(name, "float", slot, **kw)


NATIVE_OPS: dict[str, NativeOpDef] = {
    op.name: op
    for op in (
        NativeOpDef("FusedAddRelu", ("A", "B"), _compute_binary, _add_relu_worker),
        NativeOpDef("FusedHardSwish", ("X",), _compute_unary, _hardswish_worker,
                    attrs=(_f("add", HS_ADD), _f("lo", HS_LO), _f("hi", HS_HI), _f("div", HS_DIV))),
        NativeOpDef("FusedSiLU", ("X",), _compute_unary, _silu_worker),
        NativeOpDef("FusedGemmAct", ("X", "W", "B"), _compute_gemm_act, _gemm_worker,
                    attrs=(AttrDef("activation", "choice", GA_ACT, required=False, choices=GEMM_ACTIVATIONS,
                                   max_steps=GEMM_MAX_STEPS),)),
        NativeOpDef("OrtfuseAbiProbe", ("X", "Y"), _compute_probe,
                    input_type=abi.ONNX_TYPE_UNDEFINED, output_type=abi.ONNX_TYPE_DOUBLE,
                    attrs=(_f("f", PR_F), AttrDef("i", "int", PR_I),
                           AttrDef("s", "choice", PR_S, required=False, choices=PROBE_CHOICES, max_steps=3),
                           _f("fo", PR_FO, required=False, default=2.5),
                           AttrDef("io", "int", PR_IO, required=False, default=-7),
                           AttrDef("mode", "int", PR_MODE, required=False, default=0))),
    )
}

PROBE_OP = "OrtfuseAbiProbe"
"""A test-only op type (not a fused op): it reports what the ABI sees, see ``_compute_probe``."""

# Ops defined in their own modules add themselves to NATIVE_OPS when imported (after the table):
# FusedGemmActBf16 (AMX bf16 tiles, opt-in precision): native_amx.py; FusedEltwiseChain0..4: native_chain.py;
# FusedAddReluF16, FusedHardSwishF16, FusedSiLUF16 (float16 tensors): native_f16.py
from ortfuse.custom_ops import native_amx, native_chain, native_f16  # noqa: E402,F401,I001
