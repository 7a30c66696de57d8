"""How a ``FusedEltwiseChain{k}`` node encodes its program for the native kernel (plain Python, no
numba): op codes (``CHAIN_OPS``, the one elementwise op table of ``reference``), the attribute words
of the kernel state, and ``node_attrs``, which the rewriter calls to make ``chain_ops`` /
``chain_args`` / ``chain_params`` from a chain's JSON ``program``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from ortfuse.custom_ops.native.op_def import AttrDef
from ortfuse.custom_ops.reference import ELTWISE_OPS
from ortfuse.custom_ops.specs import MAX_CHAIN_OPERANDS

CHAIN_OPS = ELTWISE_OPS  # unary first (codes < N_UNARY), then binary
(OP_RELU, OP_SIGMOID, OP_TANH, OP_EXP, OP_LOG, OP_ABS, OP_NEG, OP_SQRT, OP_RECIPROCAL, OP_ERF, OP_FLOOR,
 OP_CEIL, OP_SOFTPLUS, OP_LEAKYRELU, OP_CLIP, OP_HARDSIGMOID,
 OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_POW, OP_MAX, OP_MIN) = range(len(CHAIN_OPS))
N_UNARY = OP_ADD
MATH_OPS = (OP_SIGMOID, OP_TANH, OP_EXP, OP_ERF, OP_SOFTPLUS)  # polynomial: their own loops, in 512-bit vectors
N_OPS = len(CHAIN_OPS)
MAX_STEPS = 12
MAX_INPUTS = 1 + MAX_CHAIN_OPERANDS

# attribute words of the kernel state: each list is its count, then its values
W_OPS, W_ARGS, W_PARAMS = 0, 1 + MAX_STEPS, 2 + 2 * MAX_STEPS
CHAIN_ATTRS = (AttrDef("chain_ops", "ints", W_OPS, max_steps=MAX_STEPS),
               AttrDef("chain_args", "ints", W_ARGS, max_steps=MAX_STEPS),
               AttrDef("chain_params", "floats", W_PARAMS, max_steps=2 * MAX_STEPS))

_PARAMS = {"LeakyRelu": ("alpha", None), "Clip": ("min", "max"), "HardSigmoid": ("alpha", "beta")}


def node_attrs(attrs: dict) -> dict:
    """``chain_ops`` / ``chain_args`` / ``chain_params`` of a chain's JSON ``program`` (the format of
    ``reference.eltwise_chain``); ValueError when the native kernel cannot run it."""
    steps = json.loads(attrs["program"])
    if not 1 <= len(steps) <= MAX_STEPS:
        raise ValueError(f"the native chain kernel takes 1 to {MAX_STEPS} steps, this program has {len(steps)}")
    ops, args, params = [], [], []
    for step in steps:
        op = step["op"]
        if op not in CHAIN_OPS:
            raise ValueError(f"the native chain kernel has no op {op!r}")
        code = CHAIN_OPS.index(op)
        refs = step.get("args")
        if (refs is not None) != (code >= N_UNARY):
            raise ValueError(f"step {step} has the wrong number of arguments for {op}")
        if refs is None:
            args.append(-1)
        elif len(refs) == 2 and refs.count("x") == 1:
            other = refs[1] if refs[0] == "x" else refs[0]
            k = int(other[1:])
            if not 0 <= k < MAX_CHAIN_OPERANDS:
                raise ValueError(f"step {step} names operand {other!r}; at most {MAX_CHAIN_OPERANDS} operands")
            args.append(2 * k + (refs[0] != "x"))
        else:
            raise ValueError(f"the native chain kernel needs one 'x' and one operand per binary step, got {refs}")
        ops.append(code)
        names = _PARAMS.get(op, (None, None))
        params.extend(float(step[name]) if name else 0.0 for name in names)
    return {"chain_ops": ops, "chain_args": args, "chain_params": params}


@dataclass(frozen=True)
class Step:
    """One step of an encoded chain: its op (a ``CHAIN_OPS`` name), the node input its operand is
    ("" for a unary step) and whether x is the op's first argument."""

    op: str
    operand: str
    x_first: bool


def chain_steps(ops: Sequence[int], args: Sequence[int], inputs: Sequence[str]) -> list[Step] | None:
    """The steps ``chain_ops`` / ``chain_args`` (``node_attrs``' encoding) give a chain node whose
    inputs are ``inputs`` (X, then the operands); None when they are not a program of it."""
    if not ops or len(ops) != len(args):
        return None
    steps = []
    for code, arg in zip(ops, args):
        if not 0 <= code < N_OPS:
            return None
        if code < N_UNARY:
            steps.append(Step(CHAIN_OPS[code], "", True))
            continue
        k = 1 + (arg >> 1)
        if arg < 0 or k >= len(inputs):
            return None
        steps.append(Step(CHAIN_OPS[code], inputs[k], not arg & 1))
    return steps
