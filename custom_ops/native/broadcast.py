"""Two inputs with numpy broadcasting, for the binary op families: the broadcast shape, its plan
collapsed into dims where each input follows the output or repeats (stride 0), the error status of
shapes that do not broadcast, and the compute of a binary op (``compute_binary``)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.abi import ORT_FAIL
from ortfuse.custom_ops.intrinsics import load_i64, stack_bytes, store_i64
from ortfuse.custom_ops.native.elementwise import BLOCK
from ortfuse.custom_ops.native.inputs import (
    check_input_count,
    element_count,
    make_output,
    msg_begin,
    read_float_input,
)
from ortfuse.custom_ops.native.slots import slot_api
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import DIMS_BYTES, MAX_RANK, MSG_CAP
from ortfuse.custom_ops.status_messages import cstr, msg_put, msg_put_dims, msg_status

# stack buffer of compute_binary: dims of A, B and the output, then the plan (stack_bytes needs a constant)
BINARY_SCRATCH = 8 * (3 * MAX_RANK + 1 + 3 * MAX_RANK)

_T_AND = cstr(" and ")
_T_NO_BROADCAST = cstr("input shapes ")
_T_NO_BROADCAST2 = cstr(" do not broadcast")


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
    return msg_status(api, ORT_FAIL, buf, n)


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


# args block of the broadcasting binary family (int64 words)
BA_SLOT, BA_A, BA_B, BA_O, BA_NA, BA_NB, BA_N, BA_PLAN, BA_M, BA_ROWS, BA_RPB, BA_INNER = range(12)
BINARY_ARGS_BYTES = 8 * 16


def compute_binary(kernel, ctx):
    """Compute of two float inputs (the op's declared float type) with numpy broadcasting into one
    output of the broadcast shape; the op's worker does the math on blocks of rows (or of the inner
    dim when there is one row), reading the args block (``BA_*``) this fills."""
    api = slot_api(kernel)
    st = check_input_count(api, ctx, kernel, 2)
    if st != 0:
        return st
    dims = stack_bytes(BINARY_SCRATCH)
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
