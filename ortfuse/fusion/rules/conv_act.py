"""conv_act: a Conv with the constant per-channel steps around it folded into its weights (a Mul/Add
run before an unpadded conv; bias Add, BatchNormalization, Mul/Add after it) and an activation epilogue
(Relu, Clip, HardSigmoid, HardSwish or SiLU), any of them optional but one, as one FusedConvAct.
Its former id ``conv_bn_relu`` is still accepted (``ortfuse.fusion.catalogue.RENAMED``)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from ortfuse.custom_ops import reference
from ortfuse.custom_ops.specs import OpSpec
from ortfuse.fusion.rulekit.checks import intermediate_problem
from ortfuse.fusion.rulekit.contract import Example, LoweringForm, PatternRule
from ortfuse.fusion.rulekit.conv import (
    CONV_SPEC_ATTRS,
    ConvCore,
    conv_core,
    conv_node_attrs,
    folded_weights,
    fused_attrs,
)
from ortfuse.fusion.rulekit.epilogues import match_conv_activation
from ortfuse.fusion.rulekit.examples import model, weights
from ortfuse.fusion.rulekit.lowering import MS_DOMAIN, Context, epilogue, node, std_hardswish, then
from ortfuse.fusion.rulekit.result import Lowered, Match, Reject
from ortfuse.ir.graph import GraphIndex

ID = "conv_act"


# [Mul/Add(const)...] -> Conv [-> Add(bias)] [-> BatchNormalization] [-> Mul/Add(const)...]
#   [-> Relu | Clip | HardSigmoid | HardSwish | SiLU]   ->   FusedConvAct(X, W', B')
def match(ix: GraphIndex, anchor: onnx.NodeProto) -> Match | Reject | None:
    core = conv_core(ix, anchor, ID)
    if not isinstance(core, ConvCore):
        return core
    epi = match_conv_activation(ix, core.output)
    nodes, out, kind, alpha, beta = core.nodes, core.output, "", 0.0, 0.0
    if epi is not None:
        problem = intermediate_problem(ix, core.nodes + epi.nodes, epi.output)
        if not problem:
            nodes, out = core.nodes + epi.nodes, epi.output
            kind, alpha, beta = epi.kind, epi.alpha, epi.beta
        elif len(core.nodes) == 1:
            return Reject(ID, core.nodes + epi.nodes, problem)
    if len(nodes) == 1:
        return None  # a bare Conv: nothing to fuse
    problem = intermediate_problem(ix, nodes, out)
    if problem:
        return Reject(ID, nodes, problem)
    inits = folded_weights(ix, core, anchor)
    return Match(ID, "FusedConvAct", nodes, [core.input] + [w.name for w in inits], out,
                 {**fused_attrs(core, kind), "alpha": alpha, "beta": beta}, inits)


# FusedConvAct(X, W, B; conv attrs, activation, alpha, beta) = act(conv(X, W) + B)
def _reference(x, w, b, **a):
    return reference.conv_act(x, w, b, strides=a["strides"], pads=a["pads"], dilations=a["dilations"],
                              group=a["group"], activation_kind=a["activation"], alpha=a["alpha"], beta=a["beta"])


SPEC = OpSpec("FusedConvAct", ID, ("X", "W", "B"), {**CONV_SPEC_ATTRS, "alpha": float, "beta": float}, _reference)


# ------------------------------------------------------------------------------------------------
# lowering forms. com.microsoft:FusedConv(X, W, B) = act(Conv(X, W) + B), act one of Relu, Tanh,
# Sigmoid, LeakyRelu, Clip(min, max), HardSigmoid(alpha, beta) (``activation_params``), HardSwish
# (x * HardSigmoid(x; 1/6, 1/2), no parameters); ORT 1.32 rejects Silu. ORT's NCHWc transformer
# turns a FusedConv into its blocked ``com.microsoft.nchwc:Conv`` with the activation kept, so a
# chain of them runs blocked without reorders between them (docs/ARCHITECTURE.md §9).
# ------------------------------------------------------------------------------------------------
FUSEDCONV_ACTIVATIONS = {"relu": "Relu", "clip": "Clip", "hardsigmoid": "HardSigmoid", "hardswish": "HardSwish"}


# Conv(+BN folded) -> Relu | Clip | HardSigmoid | HardSwish   ->   com.microsoft:FusedConv(X, W', B'; activation)
def lower_fusedconv(m: Match, ctx: Context) -> Lowered | str:
    """act(conv(X, W) + B) as one FusedConv; act in Relu, Clip(min, max), HardSigmoid(alpha, beta),
    HardSwish (only with HardSwish's own parameters 1/6, 1/2)."""
    kind = m.attrs["activation"]
    if kind not in FUSEDCONV_ACTIVATIONS:
        return f"FusedConv has no '{kind}' activation"
    if kind == "hardswish" and not std_hardswish(m.attrs["alpha"], m.attrs["beta"]):
        return (f"FusedConv's HardSwish has no parameters; HardSigmoid alpha {m.attrs['alpha']}, "
                f"beta {m.attrs['beta']} differs from HardSwish's")
    attrs = {**conv_node_attrs(m), "activation": FUSEDCONV_ACTIVATIONS[kind]}
    if kind in ("clip", "hardsigmoid"):
        attrs["activation_params"] = [float(m.attrs["alpha"]), float(m.attrs["beta"])]
    return Lowered([node("FusedConv", m.inputs[:3], [m.output], domain=MS_DOMAIN, **attrs)])


# Conv(+BN folded), no epilogue   ->   Conv(X, W', B')
def lower_conv(m: Match, ctx: Context) -> Lowered | str:
    """conv(X, W) + B as a plain Conv (BN and bias Add folded into W, B)."""
    if m.attrs["activation"]:
        return "a plain Conv has no epilogue"
    return Lowered([node("Conv", m.inputs[:3], [m.output], **conv_node_attrs(m))])


def _conv_then(style: str) -> Callable[[Match, Context], Lowered | str]:
    def build(m: Match, ctx: Context) -> Lowered | str:
        kind = m.attrs["activation"]
        if not kind:
            return "no epilogue to lower"
        y = ctx.fresh("conv")
        conv = node("Conv", m.inputs[:3], [y], **conv_node_attrs(m))
        return then([conv], epilogue(kind, y, m.output, ctx, m.attrs["alpha"], m.attrs["beta"], style))
    build.__doc__ = f"act(conv(X, W) + B) as Conv then the epilogue ({style} style, see ``rulekit.lowering.epilogue``)."
    return build


# Conv(+BN folded) -> HardSwish | SiLU   ->   Conv -> ai.onnx.contrib:FusedHardSwish | FusedSiLU (native)
lower_conv_native_epilogue = _conv_then("native")
# Conv(+BN folded) -> any epilogue   ->   Conv -> ORT ops (HardSwish op at opset >= 14, Sigmoid -> Mul, ...)
lower_conv_ort_epilogue = _conv_then("ort")
# Conv(+BN folded) -> HardSwish   ->   Conv -> HardSigmoid -> Mul
lower_conv_decomposed_epilogue = _conv_then("decomposed")

# Priorities, from `python tools/lowering_bench.py` on the zoo's convs (resnet50, mobilenetv3_block):
# - Relu / Clip / HardSigmoid: FusedConv and Conv + activation op tie; FusedConv is one node (what ORT
#   makes itself), so it ranks first. Without an epilogue (Conv + BN): a plain Conv.
# - HardSwish: FusedConv(HardSwish) first: ORT runs it as a blocked NCHWc conv, so neighbouring convs
#   stay blocked, which an isolated subgraph cannot show (measure whole models: `ortfuse bench
#   pplcnet_classifier mobilenetv3_block`). Then Conv + native FusedHardSwish (ahead on an isolated
#   subgraph); Conv + HardSwish op and Conv + HardSigmoid + Mul tie (the op is one node), and serve
#   where the native op is not registered.
# - SiLU: Conv + Sigmoid + Mul (ORT makes QuickGelu of it) and Conv + native FusedSiLU tie; the ORT
#   ops need no custom op, so they rank first.
LOWERING = (
    LoweringForm("fusedconv", "FusedConvAct", "com.microsoft:FusedConv", lower_fusedconv,
                 {"relu": 30, "clip": 30, "hardsigmoid": 30, "hardswish": 35}),
    LoweringForm("conv", "FusedConvAct", "Conv", lower_conv, {"": 30}),
    LoweringForm("conv_native_epilogue", "FusedConvAct", "Conv + native FusedHardSwish | FusedSiLU",
                 lower_conv_native_epilogue, {"hardswish": 30, "silu": 25},
                 native_ops={"hardswish": "FusedHardSwish", "silu": "FusedSiLU"}),
    LoweringForm("conv_ort_epilogue", "FusedConvAct", "Conv + epilogue ops", lower_conv_ort_epilogue,
                 {"relu": 20, "clip": 20, "hardsigmoid": 20, "hardswish": 26, "silu": 30}),
    LoweringForm("conv_decomposed_epilogue", "FusedConvAct", "Conv + HardSigmoid + Mul",
                 lower_conv_decomposed_epilogue, {"hardswish": 25}),
)


# ------------------------------------------------------------------------------------------------
# examples
# ------------------------------------------------------------------------------------------------
def _conv_then_ops(*ops: str, conv_is_output: bool = False, weight_input: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t0"], name="conv", strides=[2, 1], pads=[1, 0, 1, 1])]
    constants = {"b": weights([4], seed=1)}
    for k, op in enumerate(ops, 1):
        if op == "BatchNormalization":
            nodes.append(helper.make_node(op, [f"t{k - 1}", "g", "beta", "mean", "var"], [f"t{k}"], name="bn"))
            constants |= {"g": weights([4], 2) + 1, "beta": weights([4], 3), "mean": weights([4], 4),
                          "var": abs(weights([4], 5)) + 0.5}
        else:
            nodes.append(helper.make_node(op, [f"t{k - 1}"], [f"t{k}"], name=op.lower()))
    inputs = {"x": [2, 3, 8, 7]}
    if weight_input:
        inputs["w"] = [4, 3, 3, 3]
    else:
        constants["w"] = weights([4, 3, 3, 3])
    return model(nodes, inputs, [f"t{len(ops)}"] + (["t0"] if conv_is_output else []), constants)


def _conv_affine_hardswish(scale_shape: tuple[int, ...] = (1,)) -> onnx.ModelProto:
    """Conv -> Mul(scale, .) -> Add(., bias) -> x * Clip(x + 3, 0, 6) / 6, as Paddle2ONNX writes
    PP-LCNetV3's learnable affine block and HardSwish (constants first in Mul, scalars as [1])."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["s", "c"], ["m"], name="lab_mul"),
             helper.make_node("Add", ["m", "t"], ["a"], name="lab_add"),
             helper.make_node("Add", ["a", "three"], ["h0"], name="hs_add"),
             helper.make_node("Clip", ["h0", "zero", "six"], ["h1"], name="hs_clip"),
             helper.make_node("Mul", ["a", "h1"], ["h2"], name="hs_mul"),
             helper.make_node("Div", ["h2", "six"], ["y"], name="hs_div")]
    constants = {"w": weights([4, 3, 3, 3]), "b": weights([4], seed=1), "s": weights(list(scale_shape), seed=6) + 1,
                 "t": weights([1], seed=7), "three": np.float32(3), "zero": np.float32(0), "six": np.float32(6)}
    return model(nodes, {"x": [2, 3, 8, 7]}, ["y"], constants)


def _affine_then_conv(pads: int = 0, group: int = 1, kernel: int = 1, x_channels: int = 4) -> onnx.ModelProto:
    """x -> Mul(per-channel scale) -> Add(bias) -> Conv -> Relu: the affine block an activation ends
    with, before the next conv. Folded into an unpadded conv; a padded one reads it as it is."""
    nodes = [helper.make_node("Mul", ["x", "s"], ["m"], name="lab_mul"),
             helper.make_node("Add", ["t", "m"], ["a"], name="lab_add"),
             helper.make_node("Conv", ["a", "w", "b"], ["c"], name="conv", group=group, pads=[pads] * 4),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    constants = {"s": weights([1, 4, 1, 1], seed=2) + 1, "t": weights([1], seed=3) + 2,
                 "w": weights([6, 4 // group, kernel, kernel]), "b": weights([6], seed=1)}
    return model(nodes, {"x": [2, x_channels, 8, 7]}, ["y"], constants)


RULE = PatternRule(
    anchor="Conv",  # conv_core starts at a Conv
    id=ID, order=20, matcher=match, specs=(SPEC,), lowering=LOWERING,
    examples=(
        Example("conv_bn_relu", lambda: _conv_then_ops("BatchNormalization", "Relu")),
        Example("conv_hardswish", lambda: _conv_then_ops("HardSwish")),
        Example("conv_affine_hardswish", _conv_affine_hardswish),
        Example("conv_channel_affine_hardswish", lambda: _conv_affine_hardswish((1, 4, 1, 1))),
        # a 1-D [4] scale broadcasts along the width, not the channels: not folded, and the bare Conv is no candidate
        Example("affine_into_pointwise_conv", _affine_then_conv),
        Example("affine_into_grouped_3x3_conv", lambda: _affine_then_conv(group=2, kernel=3)),
        Example("affine_before_a_padded_conv_stays", lambda: _affine_then_conv(pads=1, kernel=3)),
        # x has one channel and the per-channel scale broadcasts it to four: the conv keeps reading the product
        Example("affine_that_broadcasts_its_input_stays", lambda: _affine_then_conv(x_channels=1)),
        Example("scale_along_the_width", lambda: _conv_affine_hardswish((7,)), reason=""),
        Example("weight_computed_at_run_time", lambda: _conv_then_ops("Relu", weight_input=True),
                reason="Conv weight 'w' is not a constant"),
        Example("conv_output_is_a_graph_output", lambda: _conv_then_ops("Relu", conv_is_output=True),
                reason="intermediate tensor 't0' is a graph output"),
    ),
)
