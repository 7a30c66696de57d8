"""Sizes of the native chain kernel's work units and the args block its compute fills for the workers."""

from __future__ import annotations

from ortfuse.custom_ops.native.ops.eltwise_chain.encoding import MAX_INPUTS, MAX_STEPS
from ortfuse.custom_ops.native.words import DIMS_BYTES, MAX_RANK
from ortfuse.custom_ops.specs import MAX_CHAIN_OPERANDS

BLOCK = 1 << 14     # output elements per block (the unit handed to a thread)
CHUNK = 1024        # output elements per chunk: all steps run on it while it is in L1 (X, output and
                    # an operand: 12K of 48K); larger chunks were not faster (tools/chain_bench.py)
ROW_MIN = 512       # innermost dims this long are walked row by row (no gathering)
PIECE = 256         # a polynomial step runs in pieces this long, each after hinting one piece of the next chunk

# collapsed broadcast plan: MAX_RANK records (extent, stride of input 0..MAX_INPUTS-1), innermost first
PLAN_REC = 1 + MAX_INPUTS
PLAN_BYTES = 8 * PLAN_REC * MAX_RANK
SCRATCH_BYTES = (MAX_INPUTS + 2) * DIMS_BYTES + PLAN_BYTES   # input dims, output dims, broadcast temp, plan
ACC_BYTES = 8 * MAX_INPUTS
GATHER_BYTES = 4 * CHUNK * MAX_CHAIN_OPERANDS
CHUNK_STATE_BYTES = 16 * MAX_INPUTS

# how an input is read over a chunk
K_FULL, K_SCALAR, K_GENERAL, K_UNUSED = 0, 1, 2, 3

# args block (int64 words) filled by the compute for the workers
(A_OUT, A_N, A_NIN, A_INNER, A_M, A_PLAN, A_STEPS, A_ROWS) = range(8)
A_IN = 8                                  # per input: data address, element count, kind
A_CODES = A_IN + 3 * MAX_INPUTS           # per step: op code
A_OPERAND = A_CODES + MAX_STEPS           # per step: chain_args value
A_PARAMS = A_OPERAND + MAX_STEPS          # per step: two float64 parameters
ARGS_BYTES = 8 * (A_PARAMS + 2 * MAX_STEPS)
