"""conv_bn_relu and conv_add_relu: a Conv with its bias Add, BatchNormalization and epilogue.

BN and the exporter-style bias (Constant -> Reshape -> Add) are folded into the weights at rewrite
time (inference only): W' = W * g / sqrt(var + eps), B' = (B - mean) * g / sqrt(var + eps) + beta.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from ortfuse.ir.graph import GraphIndex
from ortfuse.fusion.patterns.activations import match_conv_activation
from ortfuse.fusion.patterns.base import Match, Reject, attr, float32_problem, intermediate_problem


@dataclass
class ConvCore:
    nodes: list[onnx.NodeProto]
    output: str
    weight: np.ndarray
    bias: np.ndarray
    attrs: dict
    has_bn: bool
    has_bias_add: bool


def conv_core(ix: GraphIndex, conv: onnx.NodeProto, pattern_id: str) -> ConvCore | Reject | None:
    """Conv [-> Add(const per-channel bias)] [-> BatchNormalization], BN and bias folded."""
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
    return ConvCore(nodes, out, weight.astype(np.float32), bias.astype(np.float32), conv_attrs, has_bn, has_bias_add)


def _fused_attrs(core: ConvCore, activation: str) -> dict:
    a = core.attrs
    return {"strides": ",".join(map(str, a["strides"])), "pads": ",".join(map(str, a["pads"])),
            "dilations": ",".join(map(str, a["dilations"])), "group": a["group"], "activation": activation}


def _weights(ix: GraphIndex, core: ConvCore, node: onnx.NodeProto) -> list[onnx.TensorProto]:
    """The folded weight and bias as new initializers, with names unused in the graph."""
    base = f"{ix.name_of(node)}_fused"
    return [numpy_helper.from_array(core.weight, ix.unique_name(f"{base}_W")),
            numpy_helper.from_array(core.bias, ix.unique_name(f"{base}_B"))]


# Conv [-> Add(bias)] [-> BatchNormalization] [-> Relu | Clip | HardSigmoid | HardSwish | SiLU]
#   -> FusedConvAct(X, W', B')
def match_conv_bn_relu(ix: GraphIndex, node: onnx.NodeProto) -> Match | Reject | None:
    core = conv_core(ix, node, "conv_bn_relu")
    if not isinstance(core, ConvCore):
        return core
    epilogue = match_conv_activation(ix, core.output)
    nodes, out, kind, alpha, beta = core.nodes, core.output, "", 0.0, 0.0
    if epilogue is not None:
        problem = intermediate_problem(ix, core.nodes + epilogue.nodes, epilogue.output)
        if not problem:
            nodes, out = core.nodes + epilogue.nodes, epilogue.output
            kind, alpha, beta = epilogue.kind, epilogue.alpha, epilogue.beta
        elif len(core.nodes) == 1:
            return Reject("conv_bn_relu", core.nodes + epilogue.nodes, problem)
    if len(nodes) == 1:
        return None  # a bare Conv: nothing to fuse
    problem = intermediate_problem(ix, nodes, out)
    if problem:
        return Reject("conv_bn_relu", nodes, problem)
    weights = _weights(ix, core, node)
    return Match("conv_bn_relu", "FusedConvAct", nodes, [node.input[0]] + [w.name for w in weights], out,
                 {**_fused_attrs(core, kind), "alpha": alpha, "beta": beta}, weights)


# Conv [-> Add(bias)] [-> BatchNormalization] -> Add(residual) -> Relu
#   -> FusedConvAddAct(X, W', B', residual)
def match_conv_add_relu(ix: GraphIndex, node: onnx.NodeProto) -> Match | Reject | None:
    core = conv_core(ix, node, "conv_add_relu")
    if not isinstance(core, ConvCore):
        return core  # the Conv itself cannot be fused: the reason is reported once per pattern
    add = ix.only_consumer(core.output)
    if add is None or add.op_type != "Add":
        return None
    residual = ix.other_input(add, core.output)
    relu = ix.only_consumer(add.output[0])
    if residual is None or relu is None or relu.op_type != "Relu" or ix.const(residual) is not None:
        return None
    nodes = core.nodes + [add, relu]
    problem = float32_problem(ix, residual) or intermediate_problem(ix, nodes, relu.output[0])
    conv_shape, res_shape = ix.shape(core.output), ix.shape(residual)
    if not problem and conv_shape and res_shape and _definitely_differ(conv_shape, res_shape):
        problem = f"residual shape {res_shape} differs from the conv output shape {conv_shape}"
    if problem:
        return Reject("conv_add_relu", nodes, problem)
    weights = _weights(ix, core, node)
    return Match("conv_add_relu", "FusedConvAddAct", nodes,
                 [node.input[0]] + [w.name for w in weights] + [residual], relu.output[0],
                 _fused_attrs(core, "relu"), weights)


def _definitely_differ(a: list, b: list) -> bool:
    if len(a) != len(b):
        return True
    return any(isinstance(x, int) and isinstance(y, int) and x != y for x, y in zip(a, b))
