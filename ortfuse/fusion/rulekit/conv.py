"""The conv core shared by the conv rules: Conv [-> Add(const per-channel bias)] [-> BatchNormalization]
[-> Mul / Add by per-channel constants...] with BN, bias and scales folded into the weights, the
fused op's conv attributes, and their lowered form.

BN and the exporter-style bias (Constant -> Reshape -> Add) are folded into the weights at rewrite
time (inference only): W' = W * g / sqrt(var + eps), B' = (B - mean) * g / sqrt(var + eps) + beta.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from ortfuse.custom_ops import reference
from ortfuse.custom_ops.reference import ints
from ortfuse.fusion.rulekit.checks import attr, float32_problem
from ortfuse.fusion.rulekit.result import Match, Reject
from ortfuse.ir.graph import GraphIndex

# the conv attributes of a fused conv op (``OpSpec.attrs``), as ``fused_attrs`` writes them
CONV_SPEC_ATTRS: dict[str, type] = {"strides": str, "pads": str, "dilations": str, "group": int, "activation": str}


# FusedConvAdd[Act](X, W, B, R; CONV_SPEC_ATTRS) = act(conv(X, W) + B + R), R of the output's shape
def residual_reference(x, w, b, r, **a):
    """The numpy reference of a conv with a residual sum before its activation ("" for none)."""
    return reference.conv_act(x, w, b, strides=a["strides"], pads=a["pads"], dilations=a["dilations"],
                              group=a["group"], activation_kind=a["activation"], alpha=0.0, beta=0.0, residual=r)


@dataclass
class ConvCore:
    nodes: list[onnx.NodeProto]
    output: str
    weight: np.ndarray
    bias: np.ndarray
    attrs: dict
    has_bn: bool
    has_bias_add: bool
    input: str  # the fused op's X: the conv's input, or the tensor before the affine steps folded into it


def conv_core(ix: GraphIndex, conv: onnx.NodeProto, pattern_id: str) -> ConvCore | Reject | None:
    """Conv [-> Add(const per-channel bias)] [-> BatchNormalization] [-> Mul/Add(const)...], folded."""
    if conv.op_type != "Conv" or not conv.input[0]:
        return None
    w = ix.const(conv.input[1])
    if w is None:
        return Reject(pattern_id, [conv], f"Conv weight '{conv.input[1]}' is not a constant")
    if w.ndim != 4:
        return Reject(pattern_id, [conv], f"only 2-D convolutions are fused (weight rank {w.ndim})")
    problem = float32_problem(ix, conv.input[0], conv.output[0])
    if problem or w.dtype != np.float32:
        return Reject(pattern_id, [conv], problem or f"no kernel for dtype {w.dtype} weights")
    auto_pad = attr(conv, "auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "VALID"):
        return Reject(pattern_id, [conv], f"Conv auto_pad={auto_pad} is not supported")
    m = w.shape[0]
    bias = np.zeros(m, np.float64)
    if len(conv.input) > 2 and conv.input[2]:
        b = ix.const(conv.input[2])
        if b is None:
            return Reject(pattern_id, [conv], f"Conv bias '{conv.input[2]}' is not a constant")
        bias = b.astype(np.float64).reshape(m)
    conv_attrs = {
        "strides": list(attr(conv, "strides", [1, 1])),
        "pads": [0, 0, 0, 0] if auto_pad == "VALID" else list(attr(conv, "pads", [0, 0, 0, 0])),
        "dilations": list(attr(conv, "dilations", [1, 1])),
        "group": int(attr(conv, "group", 1)),
    }
    nodes, out, weight = [conv], conv.output[0], w.astype(np.float64)
    x = conv.input[0]
    if not any(conv_attrs["pads"]):
        weight, bias, x = _fold_input_affine(ix, conv, nodes, weight, bias, conv_attrs["group"])
    has_bias_add = has_bn = False
    add = ix.only_consumer(out)
    if add is not None and add.op_type == "Add":
        b = ix.const(ix.other_input(add, out) or "")
        # per-channel means shape [M,1,1] or [1,M,1,1]; a 1-D [M] would broadcast along the width
        per_channel = b is not None and b.shape in ((m, 1, 1), (1, m, 1, 1))
        uniform = b is not None and b.size == 1 and b.ndim <= 4
        if per_channel or uniform:
            bias = bias + np.broadcast_to(b.astype(np.float64).reshape(-1), (m,))
            nodes.append(add)
            out = add.output[0]
            has_bias_add = True
    bn = ix.only_consumer(out)
    if bn is not None and bn.op_type == "BatchNormalization" and bn.input[0] == out:
        params = [ix.const(name) for name in bn.input[1:5]]
        per_channel = all(p is not None and p.size == m for p in params) and attr(bn, "spatial", 1) == 1
        if per_channel and not attr(bn, "training_mode", 0) and not any(bn.output[1:]):
            gamma, beta, mean, var = (p.astype(np.float64).reshape(m) for p in params)
            scale = gamma / np.sqrt(var + float(attr(bn, "epsilon", 1e-5)))
            weight = weight * scale.reshape(m, 1, 1, 1)
            bias = (bias - mean) * scale + beta
            nodes.append(bn)
            out = bn.output[0]
            has_bn = True
    weight, bias, out = _fold_affine(ix, nodes, out, m, weight, bias)
    return ConvCore(nodes, out, weight.astype(np.float32), bias.astype(np.float32), conv_attrs, has_bn, has_bias_add,
                    x)


def _channel_constant(ix: GraphIndex, node: onnx.NodeProto, x: str, m: int) -> np.ndarray | None:
    """The constant operand of ``node`` (applied to ``x``) as M per-channel float64 values, when it is
    uniform or per output channel ([M,1,1], [1,M,1,1]); else None (a 1-D [M] broadcasts along W)."""
    other = ix.other_input(node, x)
    c = ix.const(other) if other and other != x else None
    if c is None or c.dtype != np.float32:
        return None
    if c.size == 1 and c.ndim <= 4:
        return np.full(m, float(c.reshape(-1)[0]))
    if c.shape in ((m, 1, 1), (1, m, 1, 1)):
        return c.astype(np.float64).reshape(m)
    return None


def _fold_input_affine(ix: GraphIndex, conv: onnx.NodeProto, nodes: list[onnx.NodeProto], weight: np.ndarray,
                       bias: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Fold the run of Mul / Add by per-channel or uniform constants that feeds an unpadded conv (the
    affine block after an activation, before a pointwise conv): with X' = a X + b per input channel,
    conv(X', W) + B = conv(X, W a) + B + sum over (c, kernel) of W b. Exact only without padding
    (a padded border would read a X + b where the original reads 0). Adds the folded nodes to
    ``nodes``; returns the weight, bias and the tensor the folded conv reads."""
    m, per_group = weight.shape[0], weight.shape[1]
    channels = per_group * group
    steps: list[tuple[onnx.NodeProto, np.ndarray]] = []
    x = conv.input[0]
    while True:
        node = ix.producer.get(x)
        if node is None or node.op_type not in ("Mul", "Add") or len(node.input) != 2 or id(node) in ix.claimed:
            break  # (a claimed step already belongs to the conv before it)
        if ix.only_consumer(x) is not (conv if not steps else steps[-1][0]) or x in ix.graph_outputs:
            break
        source = next((i for i in node.input if ix.const(i) is None), None)
        values = _channel_constant(ix, node, source, channels) if source else None
        shape = ix.shape(source) if source else None
        if values is None or shape is None or shape != ix.shape(x):
            break  # the conv must read a tensor of its input's shape (the constant broadcasts, not x)
        steps.append((node, values))
        x = source
    if not steps:
        return weight, bias, conv.input[0]
    a, b = np.ones(channels), np.zeros(channels)
    for node, values in reversed(steps):  # from X forwards: Mul scales both, Add shifts
        if node.op_type == "Mul":
            a, b = a * values, b * values
        else:
            b = b + values
    # input channel of W[o, j] is (o // (m // group)) * per_group + j
    cols = (np.arange(m) // (m // group))[:, None] * per_group + np.arange(per_group)[None, :]
    bias = bias + (weight * b[cols][:, :, None, None]).sum(axis=(1, 2, 3))
    weight = weight * a[cols][:, :, None, None]
    nodes.extend(node for node, _ in steps)
    return weight, bias, x


def _fold_affine(ix: GraphIndex, nodes: list[onnx.NodeProto], out: str, m: int, weight: np.ndarray,
                 bias: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """Fold the run of Mul / Add by per-channel or uniform constants after the conv (PP-LCNetV3's
    learnable affine blocks, exporters' scale layers): s * (conv(X, W) + B) + c = conv(X, s W) + (s B + c).
    Appends the folded nodes to ``nodes``; returns the weight, bias and output after them."""
    while True:
        node = ix.only_consumer(out)
        if node is None or node.op_type not in ("Mul", "Add") or len(node.input) != 2:
            return weight, bias, out
        values = _channel_constant(ix, node, out, m)
        if values is None:
            return weight, bias, out
        if node.op_type == "Mul":
            weight, bias = weight * values.reshape(m, 1, 1, 1), bias * values
        else:
            bias = bias + values
        nodes.append(node)
        out = node.output[0]


def fused_attrs(core: ConvCore, activation: str) -> dict:
    """The fused op's conv attributes (``CONV_SPEC_ATTRS``) with its epilogue."""
    a = core.attrs
    return {"strides": ",".join(map(str, a["strides"])), "pads": ",".join(map(str, a["pads"])),
            "dilations": ",".join(map(str, a["dilations"])), "group": a["group"], "activation": activation}


def folded_weights(ix: GraphIndex, core: ConvCore, node: onnx.NodeProto) -> list[onnx.TensorProto]:
    """The folded weight and bias as new initializers, with names unused in the graph."""
    base = f"{ix.name_of(node)}_fused"
    return [numpy_helper.from_array(core.weight, ix.unique_name(f"{base}_W")),
            numpy_helper.from_array(core.bias, ix.unique_name(f"{base}_B"))]


def conv_node_attrs(m: Match) -> dict:
    """A fused conv match's attributes as a Conv (or com.microsoft:FusedConv) node takes them."""
    a = m.attrs
    return {"strides": ints(a["strides"]), "pads": ints(a["pads"]), "dilations": ints(a["dilations"]),
            "group": int(a["group"])}
