"""skip_layernorm: a residual Add (with the bias Add of the layer before it) followed by a LayerNorm
over the last axis, as one FusedSkipLayerNorm: LayerNorm(x + skip + bias) * gamma + beta.

ORT 1.32 turns a residual Add -> LayerNormalization into its SkipLayerNormalization kernel wherever
it knows both Add inputs have one 3-D shape (dynamo exports, which type every tensor), and that
kernel is slower on the CPU than the Adds and LayerNormalization it replaces (priorities below); on
TorchScript exports ORT leaves the Adds beside its LayerNormalization. The first form writes the two
Adds as one Sum, which ORT does not fuse further. Matching here also keeps these Adds out of the
generic eltwise_chain. LayerNorm: the op or its opset < 17 decomposition (``rulekit.layernorm``). The bias Add
folded in is ``Add(t, b)`` or ``Add(b, t)`` with b a constant vector of the hidden size, read only
by the residual Add. The skip may broadcast over the batch ([1, S, D] or [S, D], a position
embedding); the input must be [B, S, D].
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse.custom_ops.specs import OpSpec
from ortfuse.fusion.rulekit.checks import float32_problem, intermediate_problem
from ortfuse.fusion.rulekit.contract import Anchor, Example, LoweringForm, NativeKernel, PatternRule
from ortfuse.fusion.rulekit.examples import layer_norm_nodes, model, weights
from ortfuse.fusion.rulekit.layernorm import layer_norm, lowered_layer_norm
from ortfuse.fusion.rulekit.lowering import MS_DOMAIN, Context, node
from ortfuse.fusion.rulekit.result import Lowered, Match, Reject
from ortfuse.ir.graph import GraphIndex

ID = "skip_layernorm"


def _biased(ix: GraphIndex, tensor: str, hidden: int) -> tuple[str, np.ndarray | None, list[onnx.NodeProto]]:
    """(t, b, [Add]) when ``tensor`` = t + b with b a constant [hidden] read only here, else (tensor, None, [])."""
    add = ix.parent(tensor, "Add", domain=None)
    if add is None or ix.only_consumer(tensor) is None:
        return tensor, None, []
    for i in (0, 1):
        b = ix.const(add.input[i])
        if b is not None and b.ndim == 1 and b.size == hidden and ix.const(add.input[1 - i]) is None:
            return add.input[1 - i], b, [add]
    return tensor, None, []


def _broadcasts(shape: list | None) -> bool:
    """A skip shape that broadcasts over the batch: rank 2, or a static 1 first."""
    return shape is not None and (len(shape) == 2 or (len(shape) == 3 and shape[0] == 1))


# Add(x, Add(bias, h)) -> LayerNormalization | ReduceMean..Add(beta)   ->   FusedSkipLayerNorm(h, x, gamma, beta, bias)
def match(ix: GraphIndex, anchor: onnx.NodeProto) -> Match | Reject | None:
    if len(anchor.input) != 2:
        return None
    ln = layer_norm(ix, anchor.output[0])
    if ln is None:
        return None
    hidden = ln.gamma.size
    a, b = anchor.input
    if ix.const(a) is not None or ix.const(b) is not None:
        return None  # a constant operand is a bias, not a residual
    shapes = {t: ix.shape(t) for t in (a, b)}
    if _broadcasts(shapes[a]) and not _broadcasts(shapes[b]):
        a, b = b, a
    nodes = [anchor] + ln.nodes
    x, bias, bias_nodes = _biased(ix, a, hidden)
    skip = b
    if bias is None and not _broadcasts(shapes[b]):
        other, other_bias, other_nodes = _biased(ix, b, hidden)
        if other_bias is not None:
            x, bias, bias_nodes, skip = other, other_bias, other_nodes, a
    nodes = bias_nodes + nodes
    problem = ""
    xs, ss = ix.shape(x), ix.shape(skip)
    if xs is None or len(xs) != 3:
        problem = f"input '{x}' is not known to be [batch, seq, hidden]: SkipLayerNormalization takes rank 3"
    elif _broadcasts(xs) or (ss is not None and len(ss) not in (2, 3)):
        problem = f"'{x}' and '{skip}' do not add as [batch, seq, hidden] + [batch or 1, seq, hidden]"
    elif xs[-1] not in (hidden, None) or (ss is not None and ss[-1] not in (hidden, None)):
        problem = f"the LayerNorm's {hidden} weights do not match the last dimension of '{x}' or '{skip}'"
    problem = problem or float32_problem(ix, x, skip, ln.output) or intermediate_problem(ix, nodes, ln.output)
    if problem:
        return Reject(ID, nodes, problem)
    base = f"{ix.name_of(anchor)}_fused"
    vectors = (("gamma", ln.gamma), ("beta", ln.beta), ("bias", bias if bias is not None else np.zeros(hidden)))
    inits = [numpy_helper.from_array(v.astype(np.float32).reshape(hidden), ix.unique_name(f"{base}_{n}"))
             for n, v in vectors]
    return Match(ID, "FusedSkipLayerNorm", nodes, [x, skip] + [t.name for t in inits], ln.output,
                 {"epsilon": float(ln.epsilon)}, inits)


def reference(x, skip, gamma, beta, bias, epsilon: float, **_):
    """LayerNorm(x + skip + bias) * gamma + beta over the last axis, in float64."""
    s = x.astype(np.float64) + skip.astype(np.float64) + bias.astype(np.float64)
    mean = s.mean(axis=-1, keepdims=True)
    var = ((s - mean) ** 2).mean(axis=-1, keepdims=True)
    return ((s - mean) / np.sqrt(var + epsilon) * gamma + beta).astype(np.float32)


# FusedSkipLayerNorm(X[B, S, D], Skip[B|1, S, D], Gamma[D], Beta[D], Bias[D]; epsilon)
SPEC = OpSpec("FusedSkipLayerNorm", ID, ("X", "Skip", "Gamma", "Beta", "Bias"), {"epsilon": float}, reference)


# FusedSkipLayerNorm   ->   com.microsoft:SkipLayerNormalization(X, Skip, Gamma, Beta, Bias; epsilon)
def lower_skiplayernorm(m: Match, ctx: Context) -> Lowered | str:
    return Lowered([node("SkipLayerNormalization", m.inputs, [m.output], domain=MS_DOMAIN,
                         epsilon=float(m.attrs["epsilon"]))])


# FusedSkipLayerNorm   ->   Sum(X, Skip, Bias) -> LayerNormalization (opset >= 17; else its decomposition)
def lower_sum_layernorm(m: Match, ctx: Context) -> Lowered | str:
    """One Sum for the bias and residual Adds, then the LayerNorm ORT runs as its LayerNormalization
    kernel: ORT's SkipLayerNormFusion matches Add, not Sum, so it keeps this form."""
    x, skip, gamma, beta, bias = m.inputs
    total = ctx.fresh("residual_sum")
    ln = lowered_layer_norm(total, m.output, gamma, beta, float(m.attrs["epsilon"]), ctx)
    return Lowered([node("Sum", [x, skip, bias], [total])] + ln.nodes, ln.initializers)


# Priorities (ORT 1.32, CPU): ORT's SkipLayerNormalization kernel takes longer than the Add + Add +
# LayerNormalization it replaces, and ORT makes that very kernel of Add -> LayerNormalization wherever
# it knows the shapes (dynamo exports); Sum -> LayerNormalization runs as fast as the Adds and ORT
# leaves it alone. So sum_layernorm first. Measured in the whole model per machine by
# `ortfuse rank MODEL --pattern skip_layernorm` (docs/ARCHITECTURE.md §5).
LOWERING = (
    LoweringForm("sum_layernorm", "FusedSkipLayerNorm", "Sum + LayerNormalization", lower_sum_layernorm, {"": 30}),
    LoweringForm("skiplayernorm", "FusedSkipLayerNorm", "com.microsoft:SkipLayerNormalization",
                 lower_skiplayernorm, {"": 20}),
)


# ------------------------------------------------------------------------------------------------
# examples
# ------------------------------------------------------------------------------------------------
def _residual_ln(decomposed: bool, skip_shape=(2, 5, 8), x_shape=(2, 5, 8)) -> onnx.ModelProto:
    """h = x @ W; Add(bias, h) + skip -> LayerNorm (op, or decomposed as TorchScript writes it)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["bias", "h"], ["hb"]),
             helper.make_node("Add", ["hb", "skip"], ["s"])]
    consts = {"w": weights([8, 8]), "bias": weights([8], seed=1), "gamma": 1.0 + weights([8], seed=2, scale=0.1),
              "beta": weights([8], seed=3, scale=0.1)}
    opset = 14 if decomposed else 17
    ln, ln_consts = layer_norm_nodes("s", "y", opset)
    nodes += ln
    consts.update(ln_consts)
    return model(nodes, {"x": list(x_shape), "skip": list(skip_shape)}, ["y"], consts, opset=opset)


# The native kernel (custom_ops/native/ops/skip_layernorm.py: the Adds and the LayerNorm in one pass
# over each row) ranks below the lowered forms statically; `ortfuse rank MODEL --pattern
# skip_layernorm` puts it first on a machine where it measures faster in the whole model.
NATIVE = (NativeKernel("FusedSkipLayerNorm"),)

RULE = PatternRule(
    anchor=Anchor("Add", onnx_only=True),
    id=ID, order=35, matcher=match, specs=(SPEC,), native=NATIVE, lowering=LOWERING,
    examples=(
        Example("torchscript_decomposed", lambda: _residual_ln(True)),
        Example("layernormalization_op", lambda: _residual_ln(False)),
        Example("position_embedding_skip", lambda: _residual_ln(False, skip_shape=(1, 5, 8))),
        Example("rank2_input", lambda: _residual_ln(False, skip_shape=(5, 8), x_shape=(5, 8)),
                reason="SkipLayerNormalization takes rank 3"),
    ),
)
