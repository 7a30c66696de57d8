"""``FusedEmbedLayerNorm``: an encoder's embeddings, the word, token-type and position rows of each
token added and normalized in one pass over the token's row (docs/ARCHITECTURE.md §5).

Inputs: Ids [Bi, Si] and TypeIds [Bt, St], int64; Word [Vw, D], Types [Vt, D], Positions [P, D],
Gamma [D], Beta [D], float32. Attribute ``epsilon``. Output Y [B, S, D] with B, S the broadcast of
the two id shapes and of the Sp = min(Si, P) position rows, as ONNX's Add broadcasts
Gather(Word, Ids) + Gather(Types, TypeIds) + Positions[:Si][None]; per row:

    t = Word[id] + Types[type id] + Positions[s or 0];
    Y = (t - mean(t)) / sqrt(mean((t - mean(t))^2) + epsilon) * Gamma + Beta

An id is taken as ONNX's Gather takes it: any value in [-V, V-1], a negative one counted from the
end of its table. Before any row is written, every id is checked: one outside its table, shapes that
do not broadcast, or any other rank, shape or element type is an ORT error status (INVALID_ARGUMENT)
naming what was expected; no row is read outside its table. A work block is a run of whole rows;
each row's sum is written to Y and normalized there while it is in cache (the mean and the variance
in two passes over it, as the reference computes them).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from ortfuse.custom_ops.abi import ONNX_TYPE_INT64, ONNX_TYPE_UNDEFINED, ORT_INVALID_ARGUMENT
from ortfuse.custom_ops.intrinsics import int_to_voidptr, load_f64, load_i64, stack_bytes, store_f64, store_i64
from ortfuse.custom_ops.native.elementwise import f32_view
from ortfuse.custom_ops.native.inputs import (
    check_input_count,
    fail,
    make_output,
    msg_begin,
    read_float_input,
    read_input,
)
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.reductions import row_sum, squared_deviation
from ortfuse.custom_ops.native.slots import slot_api, slot_f32
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import DIMS_BYTES, MSG_CAP
from ortfuse.custom_ops.status_messages import cstr, msg_put, msg_put_int, msg_status

OP = "FusedEmbedLayerNorm"
INPUTS = ("Ids", "TypeIds", "Word", "Types", "Positions", "Gamma", "Beta")
WA_EPSILON = 0
ATTRS = (AttrDef("epsilon", "float", WA_EPSILON),)
BLOCK_FLOATS = 16 * 1024  # floats of Y per work block (whole rows, at least one): a few rows for ORT's pool
# args block (int64 words)
(EL_IDS, EL_TIDS, EL_WORD, EL_TYPES, EL_POS, EL_GAMMA, EL_BETA, EL_Y, EL_ROWS, EL_D, EL_SEQ, EL_ID_B, EL_ID_S,
 EL_TID_B, EL_TID_S, EL_POS_S, EL_VW, EL_VT, EL_NPOS, EL_IDS_N, EL_TIDS_N, EL_PER_BLOCK, EL_EPS) = range(23)
ARGS_BYTES = 8 * 23

_T_IDS = cstr("Ids and TypeIds must be int64 tensors of rank 2 [batch, seq], got ONNX element type ")
_T_RANK = cstr(" and rank ")
_T_FOR_INPUT = cstr(" for input ")
_T_TABLES = cstr("Word, Types and Positions must be [rows, hidden] and Gamma and Beta [hidden] of one hidden size")
_T_BROADCAST = cstr("Ids, TypeIds and the position rows do not broadcast to one [batch, seq]: ")
_T_OUT_OF_RANGE = cstr("indices element out of data bounds, idx=")
_T_RANGE = cstr(" must be within the inclusive range [")
_T_COMMA = cstr(",")
_T_CLOSE = cstr("] (input ")
_T_PAREN = cstr(")")
_T_X = cstr(" x ")


@njit(cache=True)
def _i64_view(addr, n):
    """The n int64 values at ``addr`` as an array."""
    return carray(int_to_voidptr(addr), (n,), np.int64)


@njit(cache=True)
def _broadcast(a, b):
    """The broadcast of two dims (ONNX's rule), or -1 if they do not broadcast."""
    if a == b or b == 1:
        return a
    if a == 1:
        return b
    return -1


@njit(cache=True)
def _first_out_of_range(ids, n, rows):
    """The index of the first id outside [-rows, rows - 1], or -1."""
    for i in range(n):
        v = ids[i]
        if v < -rows or v >= rows:
            return i
    return -1


@njit(cache=True)
def _fail_id(api, slot, index, value, rows):
    """ORT Gather's message for an id outside its table."""
    buf = stack_bytes(MSG_CAP)
    n = msg_begin(buf, slot)
    n = msg_put(buf, MSG_CAP, n, _T_OUT_OF_RANGE)
    n = msg_put_int(buf, MSG_CAP, n, value)
    n = msg_put(buf, MSG_CAP, n, _T_RANGE)
    n = msg_put_int(buf, MSG_CAP, n, -rows)
    n = msg_put(buf, MSG_CAP, n, _T_COMMA)
    n = msg_put_int(buf, MSG_CAP, n, rows - 1)
    n = msg_put(buf, MSG_CAP, n, _T_CLOSE)
    n = msg_put_int(buf, MSG_CAP, n, index)
    n = msg_put(buf, MSG_CAP, n, _T_PAREN)
    return msg_status(api, ORT_INVALID_ARGUMENT, buf, n)


@njit(cache=True)
def _fail_ids(api, slot, index, elem, rank):
    buf = stack_bytes(MSG_CAP)
    n = msg_begin(buf, slot)
    n = msg_put(buf, MSG_CAP, n, _T_IDS)
    n = msg_put_int(buf, MSG_CAP, n, elem)
    n = msg_put(buf, MSG_CAP, n, _T_RANK)
    n = msg_put_int(buf, MSG_CAP, n, rank)
    n = msg_put(buf, MSG_CAP, n, _T_FOR_INPUT)
    n = msg_put_int(buf, MSG_CAP, n, index)
    return msg_status(api, ORT_INVALID_ARGUMENT, buf, n)


@njit(cache=True)
def _fail_broadcast(api, slot, dids, dtids, npos):
    buf = stack_bytes(MSG_CAP)
    n = msg_begin(buf, slot)
    n = msg_put(buf, MSG_CAP, n, _T_BROADCAST)
    n = msg_put_int(buf, MSG_CAP, n, load_i64(dids))
    n = msg_put(buf, MSG_CAP, n, _T_X)
    n = msg_put_int(buf, MSG_CAP, n, load_i64(dids + 8))
    n = msg_put(buf, MSG_CAP, n, _T_COMMA)
    n = msg_put_int(buf, MSG_CAP, n, load_i64(dtids))
    n = msg_put(buf, MSG_CAP, n, _T_X)
    n = msg_put_int(buf, MSG_CAP, n, load_i64(dtids + 8))
    n = msg_put(buf, MSG_CAP, n, _T_COMMA)
    n = msg_put_int(buf, MSG_CAP, n, npos)
    return msg_status(api, ORT_INVALID_ARGUMENT, buf, n)


@njit(nogil=True, error_model="numpy", cache=True)
def embed_rows(ids, tids, word, types, pos, gamma, beta, y, d, r0, r1, seq, id_b, id_s, tid_b, tid_s, pos_s, vw, vt,
               eps):
    """Rows r0..r1 of Y ([rows * d]); row r = b * seq + s reads id ``ids[b * id_b + s * id_s]`` (wrapped
    into [0, vw)), type id ``tids[b * tid_b + s * tid_s]`` (into [0, vt)) and position row ``s * pos_s``.
    Every id must already be in [-v, v - 1]."""
    inv_d = np.float32(1.0) / np.float32(d)
    for r in range(r0, r1):
        b = r // seq
        s = r - b * seq
        w = ids[b * id_b + s * id_s]
        t = tids[b * tid_b + s * tid_s]
        if w < 0:
            w += vw
        if t < 0:
            t += vt
        p = s * pos_s
        at = r * d
        # slices: indices numba knows are >= 0, so the row loop vectorizes
        row, wr, tr, pr = y[at:at + d], word[w * d:w * d + d], types[t * d:t * d + d], pos[p * d:p * d + d]
        for k in range(d):
            row[k] = wr[k] + tr[k] + pr[k]
        mean = row_sum(row) * inv_d
        rstd = np.float32(1.0) / np.sqrt(squared_deviation(row, mean) * inv_d + eps)
        for k in range(d):
            row[k] = (row[k] - mean) * rstd * gamma[k] + beta[k]


def compute_embed_layernorm(kernel, ctx):
    """Check the ids, tables and vectors; every id in range; allocate Y [B, S, D]; run the blocks of rows."""
    api = slot_api(kernel)
    st = check_input_count(api, ctx, kernel, 7)
    if st != 0:
        return st
    dids = stack_bytes(DIMS_BYTES)
    dtids = stack_bytes(DIMS_BYTES)
    dv = stack_bytes(DIMS_BYTES)
    st, pids, elem, rank = read_input(api, ctx, 0, dids)
    if st != 0:
        return st
    if elem != ONNX_TYPE_INT64 or rank != 2:
        return _fail_ids(api, kernel, 0, elem, rank)
    st, ptids, elem, rank = read_input(api, ctx, 1, dtids)
    if st != 0:
        return st
    if elem != ONNX_TYPE_INT64 or rank != 2:
        return _fail_ids(api, kernel, 1, elem, rank)
    # tables (rows, hidden), then the vectors (hidden)
    addrs = stack_bytes(40)
    rows_of = stack_bytes(24)
    d = np.int64(-1)
    for i in range(5):
        st, pv, rv = read_float_input(api, ctx, kernel, 2 + i, dv)
        if st != 0:
            return st
        want = 2 if i < 3 else 1
        hidden = load_i64(dv + 8 * (want - 1)) if rv == want else -2
        if d == -1:
            d = hidden
        if rv != want or hidden != d:
            return fail(api, kernel, _T_TABLES)
        if i < 3:
            store_i64(rows_of + 8 * i, load_i64(dv))
        store_i64(addrs + 8 * i, pv)
    vw = load_i64(rows_of)
    vt = load_i64(rows_of + 8)
    bi = load_i64(dids)
    si = load_i64(dids + 8)
    bt = load_i64(dtids)
    st_ = load_i64(dtids + 8)
    npos = min(si, load_i64(rows_of + 16))  # Positions[:Si]: a Slice ending at Si
    batch = _broadcast(bi, bt)
    seq = _broadcast(si, st_)
    seq = _broadcast(seq, npos) if seq >= 0 else -1
    if batch < 0 or seq < 0:
        return _fail_broadcast(api, kernel, dids, dtids, npos)
    n_ids = bi * si
    n_tids = bt * st_
    rows = batch * seq
    if rows > 0:  # the ids a row reads, all checked before any row is written
        bad = _first_out_of_range(_i64_view(pids, n_ids), n_ids, vw)
        if bad >= 0:
            return _fail_id(api, kernel, 0, _i64_view(pids, n_ids)[bad], vw)
        bad = _first_out_of_range(_i64_view(ptids, n_tids), n_tids, vt)
        if bad >= 0:
            return _fail_id(api, kernel, 1, _i64_view(ptids, n_tids)[bad], vt)
    dy = stack_bytes(24)
    store_i64(dy, batch)
    store_i64(dy + 8, seq)
    store_i64(dy + 16, d)
    st, py = make_output(api, ctx, 0, dy, 3)
    if st != 0 or rows * d == 0:
        return st
    per_block = max(1, BLOCK_FLOATS // d)
    args = stack_bytes(ARGS_BYTES)
    for word, value in ((EL_IDS, pids), (EL_TIDS, ptids), (EL_WORD, load_i64(addrs)), (EL_TYPES, load_i64(addrs + 8)),
                        (EL_POS, load_i64(addrs + 16)), (EL_GAMMA, load_i64(addrs + 24)),
                        (EL_BETA, load_i64(addrs + 32)), (EL_Y, py), (EL_ROWS, rows), (EL_D, d),
                        (EL_SEQ, seq), (EL_ID_B, si if bi > 1 else 0), (EL_ID_S, 1 if si > 1 else 0),
                        (EL_TID_B, st_ if bt > 1 else 0), (EL_TID_S, 1 if st_ > 1 else 0),
                        (EL_POS_S, 1 if npos > 1 else 0), (EL_VW, vw), (EL_VT, vt),
                        (EL_NPOS, max(npos, 1)), (EL_IDS_N, n_ids), (EL_TIDS_N, n_tids), (EL_PER_BLOCK, per_block)):
        store_i64(args + 8 * word, value)
    store_f64(args + 8 * EL_EPS, np.float64(slot_f32(kernel, WA_EPSILON)))
    return run_blocks(api, ctx, kernel, args, (rows + per_block - 1) // per_block, rows * d * 4)


def _embed_layernorm_worker(args, block):
    rows = load_i64(args + 8 * EL_ROWS)
    d = load_i64(args + 8 * EL_D)
    vw = load_i64(args + 8 * EL_VW)
    vt = load_i64(args + 8 * EL_VT)
    per_block = load_i64(args + 8 * EL_PER_BLOCK)
    r0 = block * per_block
    embed_rows(_i64_view(load_i64(args + 8 * EL_IDS), load_i64(args + 8 * EL_IDS_N)),
               _i64_view(load_i64(args + 8 * EL_TIDS), load_i64(args + 8 * EL_TIDS_N)),
               f32_view(load_i64(args + 8 * EL_WORD), vw * d), f32_view(load_i64(args + 8 * EL_TYPES), vt * d),
               f32_view(load_i64(args + 8 * EL_POS), load_i64(args + 8 * EL_NPOS) * d),
               f32_view(load_i64(args + 8 * EL_GAMMA), d), f32_view(load_i64(args + 8 * EL_BETA), d),
               f32_view(load_i64(args + 8 * EL_Y), rows * d), d, r0, min(rows, r0 + per_block),
               load_i64(args + 8 * EL_SEQ), load_i64(args + 8 * EL_ID_B), load_i64(args + 8 * EL_ID_S),
               load_i64(args + 8 * EL_TID_B), load_i64(args + 8 * EL_TID_S), load_i64(args + 8 * EL_POS_S), vw, vt,
               np.float32(load_f64(args + 8 * EL_EPS)))


NATIVE_OPS = (NativeOpDef(OP, INPUTS, compute_embed_layernorm, _embed_layernorm_worker, attrs=ATTRS,
                          input_type=ONNX_TYPE_UNDEFINED),)
