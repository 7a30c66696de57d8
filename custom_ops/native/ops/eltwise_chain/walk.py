"""Walking a chain's output (numba): the broadcast of X and its operands collapsed into dims where
each input follows the output or repeats, how each input is read over a chunk (a run of its buffer,
one repeated element, or gathered into a stack buffer), and the worker: blocks of ``BLOCK`` output
elements, each cut into chunks of at most ``CHUNK`` on which every step runs while it is in L1."""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.intrinsics import load_f64, load_i64, stack_bytes, store_i64
from ortfuse.custom_ops.native.elementwise import HINT_MIN, f32_view
from ortfuse.custom_ops.native.ops.eltwise_chain.encoding import MATH_OPS, N_UNARY
from ortfuse.custom_ops.native.ops.eltwise_chain.sizes import (
    A_CODES,
    A_IN,
    A_INNER,
    A_M,
    A_N,
    A_NIN,
    A_OPERAND,
    A_OUT,
    A_PARAMS,
    A_PLAN,
    A_ROWS,
    A_STEPS,
    ACC_BYTES,
    BLOCK,
    CHUNK,
    CHUNK_STATE_BYTES,
    GATHER_BYTES,
    K_FULL,
    K_SCALAR,
    K_UNUSED,
    PLAN_REC,
)
from ortfuse.custom_ops.native.ops.eltwise_chain.steps import binary_step, unary_step
from ortfuse.custom_ops.native.words import DIMS_BYTES


@njit(cache=True)
def collapse(dims, ranks, nin, do, ro, plan):
    """Write the collapsed broadcast of ``nin`` inputs (dims at dims + j*DIMS_BYTES, rank at
    ranks + 8j; rank 0 for an input that is not read) into the output dims at ``do``: records
    (extent, stride of each input in elements, 0 = repeats), innermost first. Adjacent dims merge
    when every input follows across both or repeats across both. Returns the record count (>= 1)."""
    acc = stack_bytes(ACC_BYTES)
    for j in range(nin):
        store_i64(acc + 8 * j, 1)
    m = 0
    for k in range(ro - 1, -1, -1):
        ext = load_i64(do + 8 * k)
        if ext == 1:
            continue
        prev = plan + 8 * PLAN_REC * (m - 1)
        merge = m > 0
        rec = plan + 8 * PLAN_REC * m
        for j in range(nin):
            ij = load_i64(ranks + 8 * j) - ro + k
            follows = ij >= 0 and load_i64(dims + DIMS_BYTES * j + 8 * ij) == ext
            stride = load_i64(acc + 8 * j) if follows else 0
            store_i64(rec + 8 * (1 + j), stride)  # written past the last record: harmless scratch
            if merge:
                ps = load_i64(prev + 8 * (1 + j))
                if not ((stride == 0 and ps == 0) or (stride != 0 and ps != 0 and stride == ps * load_i64(prev))):
                    merge = False
            if follows:
                store_i64(acc + 8 * j, load_i64(acc + 8 * j) * ext)
        if merge:
            store_i64(prev, load_i64(prev) * ext)
        else:
            store_i64(rec, ext)
            m += 1
    if m == 0:  # every dim is 1: one element
        store_i64(plan, 1)
        for j in range(nin):
            store_i64(plan + 8 * (1 + j), 0)
        m = 1
    return m


@njit(cache=True)
def row_offset(plan, m, j, row):
    """Element offset in input j of the first element of output row ``row`` (dims above the innermost)."""
    off = np.int64(0)
    r = row
    for d in range(1, m):
        rec = plan + 8 * PLAN_REC * d
        ext = load_i64(rec)
        off += (r % ext) * load_i64(rec + 8 * (1 + j))
        r //= ext
    return off


@njit(nogil=True, cache=True)
def gather(plan, m, j, src_addr, count, dst_addr, pos, seg, inner):
    """Write input j's elements for output elements [pos, pos + seg) to dst, row piece by row piece."""
    src = f32_view(src_addr, count)
    dst = f32_view(dst_addr, seg)
    s = load_i64(plan + 8 * (1 + j))
    p = 0
    while p < seg:
        q = pos + p
        row = q // inner
        col = q - row * inner
        ln = min(seg - p, inner - col)
        off = row_offset(plan, m, j, row) + col * s
        piece = dst[p:p + ln]
        if s != 0:
            run = src[off:off + ln]
            for i in range(ln):
                piece[i] = run[i]
        else:
            v = src[off]
            for i in range(ln):
                piece[i] = v
        p += ln


@njit(nogil=True, cache=True)
def resolve(args, j, pos, seg, scratch):
    """(address, is_scalar) of input j over output elements [pos, pos + seg): a run of seg floats
    in its buffer, one float, or the run gathered at ``scratch``."""
    base = args + 8 * (A_IN + 3 * j)
    ptr = load_i64(base)
    kind = load_i64(base + 16)
    if kind == K_FULL:
        return ptr + 4 * pos, False
    if kind == K_SCALAR:
        return ptr, True
    plan = load_i64(args + 8 * A_PLAN)
    m = load_i64(args + 8 * A_M)
    inner = load_i64(args + 8 * A_INNER)
    if load_i64(args + 8 * A_ROWS) != 0:  # the chunk lies in one row: a run or one element
        row = pos // inner
        s = load_i64(plan + 8 * (1 + j))
        return ptr + 4 * (row_offset(plan, m, j, row) + (pos - row * inner) * s), s == 0
    gather(plan, m, j, ptr, load_i64(base + 8), scratch, pos, seg, inner)
    return scratch, False


@njit(nogil=True, error_model="numpy", cache=True)
def run_chunk(args, pos, seg, scratch, state, ahead):
    """Output elements [pos, pos + seg): the first step reads X and writes the output, every later
    step runs in place on the output (in L1). The first polynomial step prefetches the next
    ``ahead`` elements (the next chunk of the same block)."""
    nin = load_i64(args + 8 * A_NIN)
    out_addr = load_i64(args + 8 * A_OUT) + 4 * pos
    d = f32_view(out_addr, seg)
    addr, scalar = resolve(args, 0, pos, seg, out_addr)  # gathered X lands in the output chunk
    x = f32_view(addr, 1 if scalar else seg)
    fresh = not scalar and addr != out_addr
    if scalar:
        v = x[0]
        for i in range(seg):
            d[i] = v
    for j in range(1, nin):
        if load_i64(args + 8 * (A_IN + 3 * j + 2)) != K_UNUSED:
            addr, scalar = resolve(args, j, pos, seg, scratch + 4 * CHUNK * (j - 1))
            store_i64(state + 16 * j, addr)
            store_i64(state + 16 * j + 8, scalar)
    for s in range(load_i64(args + 8 * A_STEPS)):
        code = load_i64(args + 8 * (A_CODES + s))
        p0 = np.float32(load_f64(args + 8 * (A_PARAMS + 2 * s)))
        p1 = np.float32(load_f64(args + 8 * (A_PARAMS + 2 * s + 1)))
        if code < N_UNARY:
            unary_step(x, d, fresh, code, p0, p1, args, pos + seg, ahead)
            if code in MATH_OPS:
                ahead = 0
        else:
            operand = load_i64(args + 8 * (A_OPERAND + s))
            j = 1 + (operand >> 1)
            scalar = load_i64(state + 16 * j + 8) != 0
            c = f32_view(load_i64(state + 16 * j), 1 if scalar else seg)
            binary_step(x, d, fresh, c, c[0], scalar, code, (operand & 1) != 0)
        fresh = False


@njit(nogil=True, error_model="numpy", cache=True)
def run_block(args, block, scratch):
    n = load_i64(args + 8 * A_N)
    inner = load_i64(args + 8 * A_INNER)
    rows = load_i64(args + 8 * A_ROWS) != 0
    state = stack_bytes(CHUNK_STATE_BYTES)
    pos = block * BLOCK
    end = min(n, pos + BLOCK)  # hints stay in the block (another thread may own the next), and are
    hints = n >= HINT_MIN      # left out where the tensors fit in L2
    while pos < end:
        seg = min(end - pos, CHUNK)
        if rows:
            seg = min(seg, inner - pos % inner)
        run_chunk(args, pos, seg, scratch, state, min(end - pos - seg, CHUNK) if hints else 0)
        pos += seg


def chain_worker(args, block):
    if load_i64(args + 8 * A_ROWS) != 0:
        run_block(args, block, 0)
    else:
        scratch = stack_bytes(GATHER_BYTES)
        run_block(args, block, scratch)
