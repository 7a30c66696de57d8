"""``FusedEltwiseChainBlocked{k}``: the program of a ``FusedEltwiseChain{k}`` on a tensor in ORT's
NCHWc blocked layout, with operands that may hold one value per channel, so that an elementwise chain
with a per-channel operand (a squeeze-excite scale ``x * s + x``, a bias) runs between ORT's blocked
convolutions instead of inside a ReorderOutput ... ReorderInput pair (docs/ARCHITECTURE.md §9).

Inputs, float32: X of logical shape [N, C, H, W] whose memory is [N, C / block, H, W, block]; each
operand one of

* X's shape, in X's layout (a blocked tensor of the same shape);
* one value per channel: [N, C, 1, 1], [1, C, 1, 1] or [C, 1, 1] (memory: channel c at c, image n
  at n * C for the first form; with H = W = 1 the blocked and the plain layouts are the same);
* one element (any rank).

Attributes: those of ``FusedEltwiseChain{k}`` (``chain_ops``, ``chain_args``, ``chain_params``, made
by ``eltwise_chain.encoding.node_attrs``) and ``block``, the NCHWc block size of the graph (C a
multiple of it, and of the chunk length ``CHUNK``'s divisor). Output Y like X:

    Y[n, g, h, w, i] = program(X[n, g, h, w, i], operand values of channel g * block + i)

with the steps' math of the chain kernel (``eltwise_chain.steps``: the same float32 operations, so
the results equal the chain kernel's on the plain layout bit for bit). Any other shape is an ORT
error status naming what was expected.

Walk: groups of one image and one channel block (H * W * block elements, contiguous); per group each
per-channel operand's block of values is repeated into a chunk-long row, then the group is cut into
chunks of ``CHUNK`` elements (a multiple of ``block``, so every chunk starts at lane 0) on which every
step runs in L1, as in the chain kernel; per-channel operands read that row as a run.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.intrinsics import load_f64, load_i64, stack_bytes, store_f64, store_i64
from ortfuse.custom_ops.native.elementwise import f32_view
from ortfuse.custom_ops.native.inputs import check_input_count, element_count, fail, make_output, read_float_input
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.ops.eltwise_chain.compute import T_BAD_PROGRAM, valid_program
from ortfuse.custom_ops.native.ops.eltwise_chain.encoding import (
    CHAIN_ATTRS,
    MAX_INPUTS,
    MAX_STEPS,
    N_UNARY,
    W_ARGS,
    W_OPS,
    W_PARAMS,
)
from ortfuse.custom_ops.native.ops.eltwise_chain.steps import binary_step, unary_step
from ortfuse.custom_ops.native.slots import slot_api, slot_i64
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import ATTR_BASE, DIMS_BYTES, EXT, EXT_N_INPUTS, S_RECORD
from ortfuse.custom_ops.specs import MAX_CHAIN_OPERANDS
from ortfuse.custom_ops.status_messages import cstr

W_BLOCK = W_PARAMS + 1 + 2 * MAX_STEPS  # the attribute word after the chain's
ATTRS = CHAIN_ATTRS + (AttrDef("block", "int", W_BLOCK),)
CHUNK = 1024  # elements per chunk (L1), as the chain kernel's
WORK = 1 << 14  # elements per unit of work handed to a thread (whole groups)
MAX_BLOCK = 64

# how an operand is read
K_FULL, K_CHANNEL, K_SCALAR, K_UNUSED = 0, 1, 2, 3
# args block (int64 words)
(B_Y, B_GROUPS, B_INNER, B_LANES, B_CBLOCKS, B_GPB, B_NIN, B_STEPS) = range(8)
B_IN = 8  # per input: data address, kind, per-image stride of a per-channel operand
B_CODES = B_IN + 3 * MAX_INPUTS
B_OPERAND = B_CODES + MAX_STEPS
B_PARAMS = B_OPERAND + MAX_STEPS
ARGS_BYTES = 8 * (B_PARAMS + 2 * MAX_STEPS)
PATTERN_BYTES = 4 * CHUNK * MAX_CHAIN_OPERANDS

_T_X = cstr("X must have rank 4 with channels a multiple of the attribute block (a divisor of 1024, at most 64)")
_T_OPERAND = cstr("each operand must have X's shape, one value per channel ([N or 1, C, 1, 1] or [C, 1, 1]) "
                  "or one element")


@njit(cache=True)
def _operand_kind(d, rank, dx, n_x):
    """(kind, per-image stride) of an operand with dims at ``d`` against X's dims at ``dx``; kind -1:
    not one of the accepted shapes."""
    n0 = load_i64(dx)
    c = load_i64(dx + 8)
    count = element_count(d, rank)
    if count == 1:
        return K_SCALAR, 0
    if rank == 4 and count == n_x and load_i64(d) == n0 and load_i64(d + 8) == c \
            and load_i64(d + 16) == load_i64(dx + 16) and load_i64(d + 24) == load_i64(dx + 24):
        return K_FULL, 0
    if rank == 4 and load_i64(d + 8) == c and load_i64(d + 16) == 1 and load_i64(d + 24) == 1:
        if load_i64(d) == 1:
            return K_CHANNEL, 0
        if load_i64(d) == n0:
            return K_CHANNEL, c
    if rank == 3 and load_i64(d) == c and load_i64(d + 8) == 1 and load_i64(d + 16) == 1:
        return K_CHANNEL, 0
    return -1, 0


def compute_blocked_chain(kernel, ctx):
    """Check the program, X and the operands; allocate Y; run groups of channel blocks."""
    api = slot_api(kernel)
    nin = load_i64(load_i64(kernel + 8 * S_RECORD) + EXT + 8 * EXT_N_INPUTS)
    st = check_input_count(api, ctx, kernel, nin)
    if st != 0:
        return st
    if not valid_program(kernel, nin - 1):
        return fail(api, kernel, T_BAD_PROGRAM)
    args = stack_bytes(ARGS_BYTES)
    steps = slot_i64(kernel, W_OPS)
    for j in range(nin):
        store_i64(args + 8 * (B_IN + 3 * j + 1), K_UNUSED)
    for s in range(steps):
        code = slot_i64(kernel, W_OPS + 1 + s)
        operand = slot_i64(kernel, W_ARGS + 1 + s)
        store_i64(args + 8 * (B_CODES + s), code)
        store_i64(args + 8 * (B_OPERAND + s), operand)
        for w in range(2):
            store_f64(args + 8 * (B_PARAMS + 2 * s + w), load_f64(kernel + 8 * (ATTR_BASE + W_PARAMS + 1 + 2 * s + w)))
        if code >= N_UNARY:
            store_i64(args + 8 * (B_IN + 3 * (1 + (operand >> 1)) + 1), K_FULL)  # marks the operand used
    dx = stack_bytes(DIMS_BYTES)
    dj = stack_bytes(DIMS_BYTES)
    st, px, rx = read_float_input(api, ctx, kernel, 0, dx)
    if st != 0:
        return st
    lanes = slot_i64(kernel, W_BLOCK)
    if rx != 4 or lanes < 1 or lanes > MAX_BLOCK or CHUNK % lanes != 0 or load_i64(dx + 8) % lanes != 0:
        return fail(api, kernel, _T_X)
    n_x = element_count(dx, 4)
    store_i64(args + 8 * B_IN, px)
    store_i64(args + 8 * (B_IN + 1), K_FULL)
    for j in range(1, nin):
        st, pj, rj = read_float_input(api, ctx, kernel, j, dj)
        if st != 0:
            return st
        if load_i64(args + 8 * (B_IN + 3 * j + 1)) == K_UNUSED:
            continue
        kind, stride = _operand_kind(dj, rj, dx, n_x)
        if kind < 0:
            return fail(api, kernel, _T_OPERAND)
        store_i64(args + 8 * (B_IN + 3 * j), pj)
        store_i64(args + 8 * (B_IN + 3 * j + 1), kind)
        store_i64(args + 8 * (B_IN + 3 * j + 2), stride)
    st, py = make_output(api, ctx, 0, dx, 4)
    if st != 0 or n_x == 0:
        return st
    c = load_i64(dx + 8)
    inner = load_i64(dx + 16) * load_i64(dx + 24) * lanes
    groups = load_i64(dx) * (c // lanes)
    gpb = max(1, WORK // inner)
    store_i64(args + 8 * B_Y, py)
    store_i64(args + 8 * B_GROUPS, groups)
    store_i64(args + 8 * B_INNER, inner)
    store_i64(args + 8 * B_LANES, lanes)
    store_i64(args + 8 * B_CBLOCKS, c // lanes)
    store_i64(args + 8 * B_GPB, gpb)
    store_i64(args + 8 * B_NIN, nin)
    store_i64(args + 8 * B_STEPS, steps)
    return run_blocks(api, ctx, kernel, args, (groups + gpb - 1) // gpb, n_x)


@njit(nogil=True, error_model="numpy", cache=True)
def _run_chunk(args, off, seg, pats):
    """Every step on elements [off, off + seg) of X and Y; per-channel operands read their row in ``pats``."""
    x = f32_view(load_i64(args + 8 * B_IN) + 4 * off, seg)
    d = f32_view(load_i64(args + 8 * B_Y) + 4 * off, seg)
    fresh = True
    for s in range(load_i64(args + 8 * B_STEPS)):
        code = load_i64(args + 8 * (B_CODES + s))
        p0 = np.float32(load_f64(args + 8 * (B_PARAMS + 2 * s)))
        p1 = np.float32(load_f64(args + 8 * (B_PARAMS + 2 * s + 1)))
        if code < N_UNARY:
            unary_step(x, d, fresh, code, p0, p1, args, 0, 0)
        else:
            operand = load_i64(args + 8 * (B_OPERAND + s))
            j = 1 + (operand >> 1)
            kind = load_i64(args + 8 * (B_IN + 3 * j + 1))
            if kind == K_FULL:
                c = f32_view(load_i64(args + 8 * (B_IN + 3 * j)) + 4 * off, seg)
            elif kind == K_SCALAR:
                c = f32_view(load_i64(args + 8 * (B_IN + 3 * j)), 1)
            else:
                c = f32_view(pats + 4 * CHUNK * (j - 1), seg)
            binary_step(x, d, fresh, c, c[0], kind == K_SCALAR, code, (operand & 1) != 0)
        fresh = False


@njit(nogil=True, error_model="numpy", cache=True)
def run_groups(args, block, pats):
    """Groups [block * gpb, (block + 1) * gpb): per group, the per-channel rows, then its chunks."""
    groups = load_i64(args + 8 * B_GROUPS)
    inner = load_i64(args + 8 * B_INNER)
    lanes = load_i64(args + 8 * B_LANES)
    cblocks = load_i64(args + 8 * B_CBLOCKS)
    gpb = load_i64(args + 8 * B_GPB)
    nin = load_i64(args + 8 * B_NIN)
    g0 = block * gpb
    for g in range(g0, min(groups, g0 + gpb)):
        image = g // cblocks
        first = (g - image * cblocks) * lanes
        for j in range(1, nin):
            if load_i64(args + 8 * (B_IN + 3 * j + 1)) == K_CHANNEL:
                stride = load_i64(args + 8 * (B_IN + 3 * j + 2))
                src = f32_view(load_i64(args + 8 * (B_IN + 3 * j)) + 4 * (image * stride + first), lanes)
                row = f32_view(pats + 4 * CHUNK * (j - 1), CHUNK)
                for i in range(CHUNK):
                    row[i] = src[i % lanes]
        pos = 0
        while pos < inner:
            seg = min(CHUNK, inner - pos)
            _run_chunk(args, g * inner + pos, seg, pats)
            pos += seg


def _blocked_chain_worker(args, block):
    run_groups(args, block, stack_bytes(PATTERN_BYTES))


NATIVE_OPS = tuple(
    NativeOpDef(f"FusedEltwiseChainBlocked{k}", ("X",) + tuple(f"C{i}" for i in range(k)), compute_blocked_chain,
                _blocked_chain_worker, attrs=ATTRS)
    for k in range(MAX_CHAIN_OPERANDS + 1)
)
