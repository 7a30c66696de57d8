"""Lowering a fused-op match to operators ORT already has: the ``lowered`` kernel path (issue #4).

A rule turns a ``Match`` (spec name, inputs, attributes, folded initializers) into a short list of
standard (``ai.onnx``) and ``com.microsoft`` nodes, possibly ending in a native ortfuse op, that
compute the spec's numpy reference. It returns a ``Lowered`` or, when it does not apply to this
match, the reason (the registry then tries the next kernel). Nodes come back unnamed and without
provenance; the rewriter names them and writes the ``ortfuse <pattern>: replaces ...`` doc_string.

The contrib ops' semantics this relies on (ORT 1.32 CPU kernels; tests/test_lowering.py checks each
rule against the unfused model on stock ORT at ORT_DISABLE_ALL):

- ``FusedConv(X, W, B[, Z])`` = act(Conv(X, W) + B [+ Z]): the sum comes before the activation, Z
  must have the output's exact shape (no broadcasting); act is Relu, Tanh, Sigmoid, LeakyRelu,
  Clip(min, max) or HardSigmoid(alpha, beta) (``activation_params``); Silu is rejected by ORT 1.32.
- ``FusedGemm(A, B, C)`` = act(A @ B + C) with A, B 2-D.
- ``BiasGelu(A, b)`` = 0.5 y (1 + erf(y / sqrt 2)), y = A + b, b 1-D of A's last dimension.
- ``FastGelu(X, b)`` = 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3))), y = X + b (b optional).
- ``Gelu(X)`` = 0.5 X (1 + erf(X / sqrt 2)).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse.custom_ops.reference import ints
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.patterns.activations import hardsigmoid_as_hardswish
from ortfuse.fusion.patterns.base import Match

MS_DOMAIN = "com.microsoft"
LABEL_PREFIX = "lowered to ORT: "
HARDSWISH_STD = (1.0 / 6.0, 0.5)  # HardSwish(x) = x * HardSigmoid(x; 1/6, 1/2)


@dataclass
class Context:
    """What a rule may ask of the graph: its ai.onnx opset, fresh tensor names, static shapes."""

    opset: int
    fresh: Callable[[str], str]
    shape: Callable[[str], list | None] = lambda name: None


@dataclass
class Lowered:
    """The replacement: ``nodes`` in execution order, the last one writing the match output, and
    the constants they read besides the match's own initializers."""

    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto] = field(default_factory=list)

    @property
    def label(self) -> str:
        return label_of(self.nodes)


@dataclass(frozen=True)
class Rule:
    """A lowering: which spec op and epilogues (``activation`` values, "" = none) it serves, which
    native ortfuse op each epilogue needs (the registry offers the rule only where it exists), and
    ``build(match, ctx) -> Lowered | reason``."""

    op: str
    activations: tuple[str, ...]
    summary: str
    build: Callable[[Match, Context], Lowered | str]
    native_ops: dict = field(default_factory=dict)


def qualified(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"


def label_of(nodes: list[onnx.NodeProto]) -> str:
    """The report's kernel label of a lowered group: ``lowered to ORT: Conv + com.microsoft:X``."""
    return LABEL_PREFIX + " + ".join(qualified(n) for n in nodes)


def _node(op: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, domain=domain, **attrs)


def _conv_attrs(m: Match) -> dict:
    a = m.attrs
    return {"strides": ints(a["strides"]), "pads": ints(a["pads"]), "dilations": ints(a["dilations"]),
            "group": int(a["group"])}


def _std_hardswish(alpha: float, beta: float) -> bool:
    return abs(alpha - HARDSWISH_STD[0]) <= 1e-6 * HARDSWISH_STD[0] and abs(beta - HARDSWISH_STD[1]) <= 1e-6


# ------------------------------------------------------------------------------------------------
# epilogues as ORT nodes
# ------------------------------------------------------------------------------------------------
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
            nodes.append(_node("Relu", [cur], [dst]))
        elif step == "clip":
            if ctx.opset < 11:
                nodes.append(_node("Clip", [cur], [dst], min=float(alpha), max=float(beta)))
            else:
                lo = numpy_helper.from_array(np.array(alpha, np.float32), ctx.fresh("clip_min"))
                hi = numpy_helper.from_array(np.array(beta, np.float32), ctx.fresh("clip_max"))
                inits += [lo, hi]
                nodes.append(_node("Clip", [cur, lo.name, hi.name], [dst]))
        elif step == "hardsigmoid":
            nodes.append(_node("HardSigmoid", [cur], [dst], alpha=float(alpha), beta=float(beta)))
        elif step == "hardswish":
            if style == "native":
                params = hardsigmoid_as_hardswish(alpha, beta)
                if params is None:
                    return f"HardSigmoid alpha {alpha}, beta {beta} has no FusedHardSwish form"
                nodes.append(_node("FusedHardSwish", [cur], [dst], domain=DOMAIN, **params))
            elif style == "ort" and ctx.opset >= 14 and _std_hardswish(alpha, beta):
                nodes.append(_node("HardSwish", [cur], [dst]))
            else:
                hs = ctx.fresh("hardsigmoid")
                nodes += [_node("HardSigmoid", [cur], [hs], alpha=float(alpha), beta=float(beta)),
                          _node("Mul", [cur, hs], [dst])]
        elif step == "silu":
            if style == "native":
                nodes.append(_node("FusedSiLU", [cur], [dst], domain=DOMAIN))
            else:
                sig = ctx.fresh("sigmoid")
                nodes += [_node("Sigmoid", [cur], [sig]), _node("Mul", [cur, sig], [dst])]
        elif step == "gelu":
            nodes.append(_node("Gelu", [cur], [dst], domain=MS_DOMAIN))
        elif step == "gelu_tanh":
            nodes.append(_node("FastGelu", [cur], [dst], domain=MS_DOMAIN))
        else:
            return f"no ORT form for the epilogue '{step}'"
        cur = dst
    if not steps:
        return Lowered([])
    return Lowered(nodes, inits)


def _then(first: list[onnx.NodeProto], rest: Lowered | str) -> Lowered | str:
    if isinstance(rest, str):
        return rest
    return Lowered(first + rest.nodes, rest.initializers)


# ------------------------------------------------------------------------------------------------
# FusedConvAct(X, W, B; conv attrs, activation, alpha, beta) = act(conv(X, W) + B)
# ------------------------------------------------------------------------------------------------
FUSEDCONV_ACTIVATIONS = {"relu": "Relu", "clip": "Clip", "hardsigmoid": "HardSigmoid"}


# Conv(+BN folded) -> Relu | Clip | HardSigmoid   ->   com.microsoft:FusedConv(X, W', B'; activation)
def lower_fusedconv(m: Match, ctx: Context) -> Lowered | str:
    """act(conv(X, W) + B) as one FusedConv; act in Relu, Clip(min, max), HardSigmoid(alpha, beta)."""
    kind = m.attrs["activation"]
    if kind not in FUSEDCONV_ACTIVATIONS:
        return f"FusedConv has no '{kind}' activation"
    attrs = {**_conv_attrs(m), "activation": FUSEDCONV_ACTIVATIONS[kind]}
    if kind in ("clip", "hardsigmoid"):
        attrs["activation_params"] = [float(m.attrs["alpha"]), float(m.attrs["beta"])]
    return Lowered([_node("FusedConv", m.inputs[:3], [m.output], domain=MS_DOMAIN, **attrs)])


# Conv(+BN folded), no epilogue   ->   Conv(X, W', B')
def lower_conv(m: Match, ctx: Context) -> Lowered | str:
    """conv(X, W) + B as a plain Conv (BN and bias Add folded into W, B)."""
    if m.attrs["activation"]:
        return "a plain Conv has no epilogue"
    return Lowered([_node("Conv", m.inputs[:3], [m.output], **_conv_attrs(m))])


def _conv_then(style: str) -> Callable[[Match, Context], Lowered | str]:
    def build(m: Match, ctx: Context) -> Lowered | str:
        kind = m.attrs["activation"]
        if not kind:
            return "no epilogue to lower"
        y = ctx.fresh("conv")
        conv = _node("Conv", m.inputs[:3], [y], **_conv_attrs(m))
        return _then([conv], epilogue(kind, y, m.output, ctx, m.attrs["alpha"], m.attrs["beta"], style))
    build.__doc__ = f"act(conv(X, W) + B) as Conv then the epilogue ({style} style, see ``epilogue``)."
    return build


# Conv(+BN folded) -> HardSwish | SiLU   ->   Conv -> ai.onnx.contrib:FusedHardSwish | FusedSiLU (native)
lower_conv_native_epilogue = _conv_then("native")
# Conv(+BN folded) -> any epilogue   ->   Conv -> ORT ops (HardSwish op at opset >= 14, Sigmoid -> Mul, ...)
lower_conv_ort_epilogue = _conv_then("ort")
# Conv(+BN folded) -> HardSwish   ->   Conv -> HardSigmoid -> Mul
lower_conv_decomposed_epilogue = _conv_then("decomposed")


# ------------------------------------------------------------------------------------------------
# FusedConvAddAct(X, W, B, R; conv attrs, activation=relu) = relu(conv(X, W) + B + R)
# ------------------------------------------------------------------------------------------------
def _same_static_shape(a: list | None, b: list | None) -> bool:
    """Equal rank and, dim by dim, the same integer or the same named dimension (never unknown)."""
    if not a or not b or len(a) != len(b):
        return False
    return all(x is not None and x != "" and x == y for x, y in zip(a, b))


# Conv(+BN folded) -> Add(residual) -> Relu   ->   com.microsoft:FusedConv(X, W', B', Z=residual; Relu)
def lower_fusedconv_sum(m: Match, ctx: Context) -> Lowered | str:
    """relu(conv(X, W) + B + R) as one FusedConv with R as its sum input Z (added before the Relu).
    FusedConv does not broadcast Z, so R's shape must be known to equal the output's."""
    if m.attrs["activation"] != "relu":
        return f"FusedConv with a sum is lowered for relu only, not '{m.attrs['activation']}'"
    res, out = ctx.shape(m.inputs[3]), ctx.shape(m.output)
    if not _same_static_shape(res, out):
        return f"residual shape {res} is not known to equal the output shape {out} (FusedConv's Z does not broadcast)"
    return Lowered([_node("FusedConv", m.inputs[:4], [m.output], domain=MS_DOMAIN, activation="Relu",
                          **_conv_attrs(m))])


# Conv(+BN folded) -> Add(residual) -> Relu   ->   Conv -> Add -> Relu
def lower_conv_add_relu(m: Match, ctx: Context) -> Lowered | str:
    """relu(conv(X, W) + B + R) as Conv, Add (broadcasting as the original Add did), Relu."""
    if m.attrs["activation"] != "relu":
        return f"no Conv -> Add -> '{m.attrs['activation']}' form"
    y, s = ctx.fresh("conv"), ctx.fresh("sum")
    return Lowered([_node("Conv", m.inputs[:3], [y], **_conv_attrs(m)), _node("Add", [y, m.inputs[3]], [s]),
                    _node("Relu", [s], [m.output])])


# ------------------------------------------------------------------------------------------------
# FusedGemmAct(X, W[K, N], B[N]; activation) = act(X @ W + B), X of any rank
# ------------------------------------------------------------------------------------------------
# Gemm | 2-D MatMul+Add -> Relu   ->   com.microsoft:FusedGemm(X, W', b'; Relu)
def lower_fusedgemm(m: Match, ctx: Context) -> Lowered | str:
    """relu(X @ W + b) as one FusedGemm; X must be known to be 2-D."""
    if m.attrs["activation"] != "relu":
        return f"FusedGemm is lowered for relu only, not '{m.attrs['activation']}'"
    shape = ctx.shape(m.inputs[0])
    if shape is None or len(shape) != 2:
        return f"FusedGemm takes a 2-D input; '{m.inputs[0]}' has shape {shape}"
    return Lowered([_node("FusedGemm", m.inputs[:3], [m.output], domain=MS_DOMAIN, activation="Relu")])


def _matmul_then(op: str, kind: str) -> Callable[[Match, Context], Lowered | str]:
    def build(m: Match, ctx: Context) -> Lowered | str:
        if m.attrs["activation"] != kind:
            return f"MatMul -> {op} lowers '{kind}' only, not '{m.attrs['activation']}'"
        h = ctx.fresh("matmul")
        return Lowered([_node("MatMul", m.inputs[:2], [h]),
                        _node(op, [h, m.inputs[2]], [m.output], domain=MS_DOMAIN)])
    build.__doc__ = f"{kind}(X @ W + b) as MatMul then com.microsoft:{op}(h, b) (bias added inside)."
    return build


# MatMul|Gemm + Add(bias) -> erf-Gelu   ->   MatMul -> com.microsoft:BiasGelu(h, b')
lower_matmul_biasgelu = _matmul_then("BiasGelu", "gelu")
# MatMul|Gemm + Add(bias) -> tanh-Gelu   ->   MatMul -> com.microsoft:FastGelu(h, b')
lower_matmul_fastgelu = _matmul_then("FastGelu", "gelu_tanh")


# MatMul|Gemm + Add(bias) -> any epilogue   ->   MatMul -> Add -> ORT epilogue ops
def lower_matmul_add_act(m: Match, ctx: Context) -> Lowered | str:
    """act(X @ W + b) as MatMul, Add, then the epilogue in ORT ops (Relu, com.microsoft Gelu /
    FastGelu, Sigmoid -> Mul), any rank of X."""
    if not m.attrs["activation"]:
        return "no epilogue to lower"
    h, s = ctx.fresh("matmul"), ctx.fresh("biased")
    first = [_node("MatMul", m.inputs[:2], [h]), _node("Add", [h, m.inputs[2]], [s])]
    return _then(first, epilogue(m.attrs["activation"], s, m.output, ctx))


# ------------------------------------------------------------------------------------------------
# the rules, by form name (the registry's Kernel.form)
# ------------------------------------------------------------------------------------------------
CONV_ACTIVATIONS = ("relu", "clip", "hardsigmoid", "hardswish", "silu")
GEMM_ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "relu+gelu", "relu+gelu_tanh")

RULES: dict[str, Rule] = {
    "fusedconv": Rule("FusedConvAct", ("relu", "clip", "hardsigmoid"), "com.microsoft:FusedConv", lower_fusedconv),
    "conv": Rule("FusedConvAct", ("",), "Conv", lower_conv),
    "conv_native_epilogue": Rule("FusedConvAct", ("hardswish", "silu"), "Conv + native FusedHardSwish | FusedSiLU",
                                 lower_conv_native_epilogue,
                                 {"hardswish": "FusedHardSwish", "silu": "FusedSiLU"}),
    "conv_ort_epilogue": Rule("FusedConvAct", CONV_ACTIVATIONS, "Conv + epilogue ops", lower_conv_ort_epilogue),
    "conv_decomposed_epilogue": Rule("FusedConvAct", ("hardswish",), "Conv + HardSigmoid + Mul",
                                     lower_conv_decomposed_epilogue),
    "fusedconv_sum": Rule("FusedConvAddAct", ("relu",), "com.microsoft:FusedConv (sum Z)", lower_fusedconv_sum),
    "conv_add_relu": Rule("FusedConvAddAct", ("relu",), "Conv + Add + Relu", lower_conv_add_relu),
    "fusedgemm": Rule("FusedGemmAct", ("relu",), "com.microsoft:FusedGemm", lower_fusedgemm),
    "matmul_biasgelu": Rule("FusedGemmAct", ("gelu",), "MatMul + com.microsoft:BiasGelu", lower_matmul_biasgelu),
    "matmul_fastgelu": Rule("FusedGemmAct", ("gelu_tanh",), "MatMul + com.microsoft:FastGelu", lower_matmul_fastgelu),
    "matmul_add_act": Rule("FusedGemmAct", GEMM_ACTIVATIONS, "MatMul + Add + epilogue ops", lower_matmul_add_act),
}


def lower(form: str, m: Match, ctx: Context) -> Lowered | str:
    """The nodes of rule ``form`` for ``m``, or the reason the rule does not apply."""
    rule = RULES[form]
    if m.op != rule.op:
        return f"rule {form} lowers {rule.op}, not {m.op}"
    kind = m.attrs.get("activation", "")
    if kind not in rule.activations:
        return f"rule {form} does not lower the epilogue '{kind}'"
    return rule.build(m, ctx)
