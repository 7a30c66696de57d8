"""``FusedSkipLayerNorm``: the residual Add, the bias Add and the LayerNorm of an encoder layer in one
pass over each row (docs/ARCHITECTURE.md §5).

Inputs, float32: X [B, S, D]; Skip [B, S, D], [1, S, D] or [S, D] (a position embedding broadcast
over the batch); Gamma, Beta, Bias [D]. Attribute ``epsilon``. Output Y [B, S, D], per row:

    t = X + Skip + Bias;  Y = (t - mean(t)) / sqrt(mean((t - mean(t))^2) + epsilon) * Gamma + Beta

Any other rank or shape is an ORT error status naming what was expected. A work block is a run of
whole rows; each row's sum t is written to Y first and normalized there while it is in cache (the
mean and the variance in two passes over it, as the reference computes them).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.intrinsics import load_f64, load_i64, stack_bytes, store_f64, store_i64
from ortfuse.custom_ops.native.elementwise import f32_view
from ortfuse.custom_ops.native.inputs import check_input_count, fail, make_output, read_float_input
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.reductions import row_sum, squared_deviation
from ortfuse.custom_ops.native.slots import slot_api, slot_f32
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import DIMS_BYTES
from ortfuse.custom_ops.status_messages import cstr

OP = "FusedSkipLayerNorm"
WA_EPSILON = 0
ATTRS = (AttrDef("epsilon", "float", WA_EPSILON),)
BLOCK_FLOATS = 16 * 1024  # floats of X per work block (whole rows, at least one): a few rows for ORT's pool
# args block (int64 words)
SL_X, SL_SKIP, SL_GAMMA, SL_BETA, SL_BIAS, SL_Y, SL_ROWS, SL_D, SL_SKIP_ROWS, SL_PER_BLOCK, SL_EPS = range(11)
ARGS_BYTES = 8 * 11

_T_SHAPES = cstr("X must have the shape [batch, seq, hidden], Skip [batch or 1, seq, hidden] or [seq, hidden], "
                 "and Gamma, Beta and Bias [hidden]")


@njit(nogil=True, error_model="numpy", cache=True)
def normalize_rows(x, skip, gamma, beta, bias, y, d, r0, r1, skip_rows, eps):
    """Rows r0..r1 of Y (x, y: [rows * d]; skip: [skip_rows * d], row r reads skip row r % skip_rows)."""
    inv_d = np.float32(1.0) / np.float32(d)
    for r in range(r0, r1):
        at = r * d
        sat = (r % skip_rows) * d
        row, xr, sr = y[at:at + d], x[at:at + d], skip[sat:sat + d]  # slices: indices numba knows are >= 0
        for k in range(d):
            row[k] = xr[k] + sr[k] + bias[k]
        mean = row_sum(row) * inv_d
        rstd = np.float32(1.0) / np.sqrt(squared_deviation(row, mean) * inv_d + eps)
        for k in range(d):
            row[k] = (row[k] - mean) * rstd * gamma[k] + beta[k]


def compute_skip_layernorm(kernel, ctx):
    """Check X [B, S, D], Skip, Gamma, Beta, Bias; allocate Y like X; run the blocks of rows."""
    api = slot_api(kernel)
    st = check_input_count(api, ctx, kernel, 5)
    if st != 0:
        return st
    dx = stack_bytes(DIMS_BYTES)
    ds = stack_bytes(DIMS_BYTES)
    dv = stack_bytes(DIMS_BYTES)
    st, px, rx = read_float_input(api, ctx, kernel, 0, dx)
    if st != 0:
        return st
    st, ps, rs = read_float_input(api, ctx, kernel, 1, ds)
    if st != 0:
        return st
    if rx != 3 or (rs != 2 and rs != 3):
        return fail(api, kernel, _T_SHAPES)
    batch = load_i64(dx)
    seq = load_i64(dx + 8)
    d = load_i64(dx + 16)
    lead = 1 if rs == 2 else load_i64(ds)
    if (lead != 1 and lead != batch) or load_i64(ds + 8 * (rs - 2)) != seq or load_i64(ds + 8 * (rs - 1)) != d:
        return fail(api, kernel, _T_SHAPES)
    vectors = stack_bytes(24)
    for i in range(3):
        st, pv, rv = read_float_input(api, ctx, kernel, 2 + i, dv)
        if st != 0:
            return st
        if rv != 1 or load_i64(dv) != d:
            return fail(api, kernel, _T_SHAPES)
        store_i64(vectors + 8 * i, pv)
    st, py = make_output(api, ctx, 0, dx, 3)
    rows = batch * seq
    if st != 0 or rows * d == 0:
        return st
    per_block = max(1, BLOCK_FLOATS // d)
    args = stack_bytes(ARGS_BYTES)
    for word, value in ((SL_X, px), (SL_SKIP, ps), (SL_GAMMA, load_i64(vectors)), (SL_BETA, load_i64(vectors + 8)),
                        (SL_BIAS, load_i64(vectors + 16)), (SL_Y, py), (SL_ROWS, rows), (SL_D, d),
                        (SL_SKIP_ROWS, lead * seq), (SL_PER_BLOCK, per_block)):
        store_i64(args + 8 * word, value)
    store_f64(args + 8 * SL_EPS, np.float64(slot_f32(kernel, WA_EPSILON)))
    return run_blocks(api, ctx, kernel, args, (rows + per_block - 1) // per_block, rows * d * 4)


def _skip_layernorm_worker(args, block):
    rows = load_i64(args + 8 * SL_ROWS)
    d = load_i64(args + 8 * SL_D)
    skip_rows = load_i64(args + 8 * SL_SKIP_ROWS)
    per_block = load_i64(args + 8 * SL_PER_BLOCK)
    r0 = block * per_block
    normalize_rows(f32_view(load_i64(args + 8 * SL_X), rows * d), f32_view(load_i64(args + 8 * SL_SKIP), skip_rows * d),
                   f32_view(load_i64(args + 8 * SL_GAMMA), d), f32_view(load_i64(args + 8 * SL_BETA), d),
                   f32_view(load_i64(args + 8 * SL_BIAS), d), f32_view(load_i64(args + 8 * SL_Y), rows * d), d, r0,
                   min(rows, r0 + per_block), skip_rows, np.float32(load_f64(args + 8 * SL_EPS)))


NATIVE_OPS = (NativeOpDef(OP, ("X", "Skip", "Gamma", "Beta", "Bias"), compute_skip_layernorm, _skip_layernorm_worker,
                          attrs=ATTRS),)
