"""The compute of ``FusedEltwiseChain{k}`` (numba): check the inputs and the program, broadcast the
shapes in step order, allocate the output and run its blocks."""

from __future__ import annotations

from numba import njit

from ortfuse.custom_ops.intrinsics import load_f64, load_i64, stack_bytes, store_f64, store_i64
from ortfuse.custom_ops.native.broadcast import broadcast_dims, broadcast_error
from ortfuse.custom_ops.native.inputs import check_input_count, element_count, fail, make_output, read_float_input
from ortfuse.custom_ops.native.ops.eltwise_chain.encoding import MAX_INPUTS, N_OPS, N_UNARY, W_ARGS, W_OPS, W_PARAMS
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
    ARGS_BYTES,
    BLOCK,
    K_FULL,
    K_GENERAL,
    K_SCALAR,
    K_UNUSED,
    ROW_MIN,
    SCRATCH_BYTES,
)
from ortfuse.custom_ops.native.ops.eltwise_chain.walk import collapse
from ortfuse.custom_ops.native.slots import slot_api, slot_i64
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import ATTR_BASE, DIMS_BYTES, EXT, EXT_N_INPUTS, S_RECORD
from ortfuse.custom_ops.status_messages import cstr

T_BAD_PROGRAM = cstr("attributes chain_ops, chain_args and chain_params do not form a valid program "
                      "(see ortfuse.custom_ops.native.ops.eltwise_chain)")


@njit(cache=True)
def valid_program(kernel, n_operands):
    """Do the chain attributes in the slot form a program over ``n_operands`` operands (step counts
    agree, known op codes, an operand exactly for the binary steps)? Shared with blocked_chain."""
    steps = slot_i64(kernel, W_OPS)
    if steps < 1 or slot_i64(kernel, W_ARGS) != steps or slot_i64(kernel, W_PARAMS) != 2 * steps:
        return False
    for s in range(steps):
        code = slot_i64(kernel, W_OPS + 1 + s)
        operand = slot_i64(kernel, W_ARGS + 1 + s)
        if code < 0 or code >= N_OPS:
            return False
        if code < N_UNARY and operand != -1:
            return False
        if code >= N_UNARY and (operand < 0 or (operand >> 1) >= n_operands):
            return False
    return True


def compute_chain(kernel, ctx):
    """Check inputs and program, broadcast the shapes, allocate the output and run the blocks."""
    api = slot_api(kernel)
    nin = load_i64(load_i64(kernel + 8 * S_RECORD) + EXT + 8 * EXT_N_INPUTS)
    st = check_input_count(api, ctx, kernel, nin)
    if st != 0:
        return st
    if not valid_program(kernel, nin - 1):
        return fail(api, kernel, T_BAD_PROGRAM)
    scratch = stack_bytes(SCRATCH_BYTES)
    dims = scratch
    do = scratch + MAX_INPUTS * DIMS_BYTES
    tmp = do + DIMS_BYTES
    plan = tmp + DIMS_BYTES
    ranks = stack_bytes(ACC_BYTES)
    args = stack_bytes(ARGS_BYTES)
    steps = slot_i64(kernel, W_OPS)
    for s in range(steps):
        code = slot_i64(kernel, W_OPS + 1 + s)
        operand = slot_i64(kernel, W_ARGS + 1 + s)
        store_i64(args + 8 * (A_CODES + s), code)
        store_i64(args + 8 * (A_OPERAND + s), operand)
        for w in range(2):
            store_f64(args + 8 * (A_PARAMS + 2 * s + w), load_f64(kernel + 8 * (ATTR_BASE + W_PARAMS + 1 + 2 * s + w)))
        if code >= N_UNARY:
            store_i64(args + 8 * (A_IN + 3 * (1 + (operand >> 1)) + 2), K_GENERAL)  # marks the operand used
    for j in range(nin):
        st, ptr, rank = read_float_input(api, ctx, kernel, j, dims + DIMS_BYTES * j)
        if st != 0:
            return st
        used = j == 0 or load_i64(args + 8 * (A_IN + 3 * j + 2)) == K_GENERAL
        store_i64(ranks + 8 * j, rank if used else 0)
        store_i64(args + 8 * (A_IN + 3 * j), ptr)
        store_i64(args + 8 * (A_IN + 3 * j + 1), element_count(dims + DIMS_BYTES * j, rank))
        store_i64(args + 8 * (A_IN + 3 * j + 2), K_GENERAL if used else K_UNUSED)
    # output shape: the running shape broadcast with each operand, in step order
    ro = load_i64(ranks)
    for i in range(ro):
        store_i64(do + 8 * i, load_i64(dims + 8 * i))
    for s in range(steps):
        if load_i64(args + 8 * (A_CODES + s)) >= N_UNARY:
            j = 1 + (load_i64(args + 8 * (A_OPERAND + s)) >> 1)
            dj = dims + DIMS_BYTES * j
            rj = load_i64(ranks + 8 * j)
            r2 = broadcast_dims(do, ro, dj, rj, tmp)
            if r2 < 0:
                return broadcast_error(api, kernel, do, ro, dj, rj)
            for i in range(r2):
                store_i64(do + 8 * i, load_i64(tmp + 8 * i))
            ro = r2
    st, po = make_output(api, ctx, 0, do, ro)
    if st != 0:
        return st
    n = element_count(do, ro)
    if n == 0:
        return 0
    m = collapse(dims, ranks, nin, do, ro, plan)
    inner = load_i64(plan)
    for j in range(nin):
        kind_word = args + 8 * (A_IN + 3 * j + 2)
        if load_i64(kind_word) == K_GENERAL:
            count = load_i64(args + 8 * (A_IN + 3 * j + 1))
            store_i64(kind_word, K_FULL if count == n else (K_SCALAR if count == 1 else K_GENERAL))
    store_i64(args + 8 * A_OUT, po)
    store_i64(args + 8 * A_N, n)
    store_i64(args + 8 * A_NIN, nin)
    store_i64(args + 8 * A_INNER, inner)
    store_i64(args + 8 * A_M, m)
    store_i64(args + 8 * A_PLAN, plan)
    store_i64(args + 8 * A_STEPS, steps)
    store_i64(args + 8 * A_ROWS, 1 if inner >= ROW_MIN else 0)
    return run_blocks(api, ctx, kernel, args, (n + BLOCK - 1) // BLOCK, n)
