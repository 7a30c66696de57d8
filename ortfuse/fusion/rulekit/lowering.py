"""Blocks for a rule's lowering forms: a match written as operators ORT already has (``ai.onnx`` and
``com.microsoft`` nodes, possibly ending in a native ortfuse op) that compute the spec's reference.

A form's ``build(match, ctx)`` returns a ``Lowered`` or, when it does not apply to this match, the
reason (the registry then tries the next kernel). Nodes come back unnamed and without provenance;
the rewriter names them and writes the ``ortfuse <pattern>: replaces ...`` doc_string.

Semantics of the ORT ops used here (ORT 1.32 CPU kernels; tests/test_lowering.py checks every form
against the unfused model on stock ORT at ORT_DISABLE_ALL):

- ``com.microsoft:Gelu(X)`` = 0.5 X (1 + erf(X / sqrt 2)).
- ``com.microsoft:FastGelu(X, b)`` = 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3))), y = X + b (b optional).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.rulekit.epilogues import hardsigmoid_as_hardswish
from ortfuse.fusion.rulekit.result import Lowered

MS_DOMAIN = "com.microsoft"
LABEL_PREFIX = "lowered to ORT: "
HARDSWISH_STD = (1.0 / 6.0, 0.5)  # HardSwish(x) = x * HardSigmoid(x; 1/6, 1/2)


@dataclass
class Context:
    """What a form may ask of the graph: its ai.onnx opset, fresh tensor names, static shapes, and
    the native op types it may end a form in (none where only ORT's own ops are wanted)."""

    opset: int
    fresh: Callable[[str], str]
    shape: Callable[[str], list | None] = lambda name: None
    native: frozenset[str] = frozenset()


def qualified(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"


def label_of(nodes: list[onnx.NodeProto]) -> str:
    """The report's kernel label of a lowered group: ``lowered to ORT: Conv + com.microsoft:X``."""
    return LABEL_PREFIX + " + ".join(qualified(n) for n in nodes)


def node(op: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, domain=domain, **attrs)


def then(first: list[onnx.NodeProto], rest: Lowered | str) -> Lowered | str:
    """``first`` followed by ``rest`` (or ``rest``'s reason when it does not apply)."""
    if isinstance(rest, str):
        return rest
    return Lowered(first + rest.nodes, rest.initializers)


def std_hardswish(alpha: float, beta: float) -> bool:
    return abs(alpha - HARDSWISH_STD[0]) <= 1e-6 * HARDSWISH_STD[0] and abs(beta - HARDSWISH_STD[1]) <= 1e-6


def epilogue(kind: str, x: str, out: str, ctx: Context, alpha: float = 0.0, beta: float = 0.0,
             style: str = "ort") -> Lowered | str:
    """Nodes computing ``reference.activation(x, kind, alpha, beta)`` into ``out``.

    ``style``: "ort" uses ORT ops only (HardSwish op where opset >= 14 and the parameters are
    HardSwish's, else HardSigmoid -> Mul; Sigmoid -> Mul for SiLU; com.microsoft Gelu / FastGelu);
    "decomposed" writes HardSwish as HardSigmoid -> Mul always; "native" runs HardSwish and SiLU as
    the native ortfuse ops FusedHardSwish / FusedSiLU."""
    steps = [s for s in kind.split("+") if s]
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    cur = x
    for i, step in enumerate(steps):
        dst = out if i == len(steps) - 1 else ctx.fresh(step)
        if step == "relu":
            nodes.append(node("Relu", [cur], [dst]))
        elif step == "clip":
            if ctx.opset < 11:
                nodes.append(node("Clip", [cur], [dst], min=float(alpha), max=float(beta)))
            else:
                lo = numpy_helper.from_array(np.array(alpha, np.float32), ctx.fresh("clip_min"))
                hi = numpy_helper.from_array(np.array(beta, np.float32), ctx.fresh("clip_max"))
                inits += [lo, hi]
                nodes.append(node("Clip", [cur, lo.name, hi.name], [dst]))
        elif step == "hardsigmoid":
            nodes.append(node("HardSigmoid", [cur], [dst], alpha=float(alpha), beta=float(beta)))
        elif step == "hardswish":
            if style == "native":
                params = hardsigmoid_as_hardswish(alpha, beta)
                if params is None:
                    return f"HardSigmoid alpha {alpha}, beta {beta} has no FusedHardSwish form"
                nodes.append(node("FusedHardSwish", [cur], [dst], domain=DOMAIN, **params))
            elif style == "ort" and ctx.opset >= 14 and std_hardswish(alpha, beta):
                nodes.append(node("HardSwish", [cur], [dst]))
            else:
                hs = ctx.fresh("hardsigmoid")
                nodes += [node("HardSigmoid", [cur], [hs], alpha=float(alpha), beta=float(beta)),
                          node("Mul", [cur, hs], [dst])]
        elif step == "silu":
            if style == "native":
                nodes.append(node("FusedSiLU", [cur], [dst], domain=DOMAIN))
            else:
                sig = ctx.fresh("sigmoid")
                nodes += [node("Sigmoid", [cur], [sig]), node("Mul", [cur, sig], [dst])]
        elif step == "gelu":
            nodes.append(node("Gelu", [cur], [dst], domain=MS_DOMAIN))
        elif step == "gelu_tanh":
            nodes.append(node("FastGelu", [cur], [dst], domain=MS_DOMAIN))
        else:
            return f"no ORT form for the epilogue '{step}'"
        cur = dst
    if not steps:
        return Lowered([])
    return Lowered(nodes, inits)
