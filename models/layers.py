"""Layers shared by the zoo networks, written out in the op order real exporters use.

Weights come from ``g.rng``; layers draw in a fixed order, so a network's weights depend
only on its seed and not on the weight style. ``calibrate_batchnorm`` then sets a finished model's
BatchNormalization running statistics to those of the data each BN sees, the zoo's one calibration.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .builder import GraphBuilder


def he_normal(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, gain: float = 2.0) -> np.ndarray:
    """N(0, gain / fan_in) as float32."""
    return (rng.standard_normal(shape) * math.sqrt(gain / fan_in)).astype(np.float32)


def uniform(rng: np.random.Generator, low: float, high: float, size: int) -> np.ndarray:
    return rng.uniform(low, high, size).astype(np.float32)


def bias_add(g: GraphBuilder, x: str, bias: np.ndarray, hint: str = "bias") -> str:
    """Conv bias as exporters write it: ``Add(x, Reshape(bias, [1, C, 1, 1]))``."""
    b = g.weight(hint, bias)
    return g.op("Add", [x, g.op("Reshape", [b, g.ints([1, bias.size, 1, 1])])])


def conv(
    g: GraphBuilder,
    x: str,
    cin: int,
    cout: int,
    k: int,
    *,
    stride: int = 1,
    group: int = 1,
    bias: np.ndarray | None = None,
) -> str:
    """Square ``k x k`` Conv with "same" padding and He-init weights.

    A ``bias`` goes into the Conv's third input with initializer weights, and into a
    separate Constant->Reshape->Add with Constant weights (the exporter form).
    """
    w = g.weight("weight", he_normal(g.rng, (cout, cin // group, k, k), fan_in=cin // group * k * k))
    attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)
    if bias is None:
        return g.op("Conv", [x, w], **attrs)
    if g.const_weights:
        return bias_add(g, g.op("Conv", [x, w], **attrs), bias)
    return g.op("Conv", [x, w, g.weight("bias", bias)], **attrs)


def batch_norm(
    g: GraphBuilder,
    x: str,
    channels: int,
    *,
    gamma: tuple[float, float] = (0.5, 1.0),
    mean_shift: np.ndarray | None = None,
) -> str:
    """Unfolded BatchNormalization with random scale, shift and running statistics (``mean_shift``
    added to the running mean); ``calibrate_batchnorm`` can set the statistics afterwards."""
    scale = uniform(g.rng, *gamma, channels)
    beta = uniform(g.rng, -0.1, 0.1, channels)
    mean = uniform(g.rng, -0.1, 0.1, channels)
    var = uniform(g.rng, 0.5, 1.5, channels)
    if mean_shift is not None:
        mean = mean + mean_shift
    named = (("bn.weight", scale), ("bn.bias", beta), ("bn.running_mean", mean), ("bn.running_var", var))
    params = [g.weight(n, v) for n, v in named]
    return g.op("BatchNormalization", [x, *params], epsilon=1e-5)


def conv_bn(
    g: GraphBuilder,
    x: str,
    cin: int,
    cout: int,
    k: int,
    *,
    stride: int = 1,
    group: int = 1,
    gamma: tuple[float, float] = (0.5, 1.0),
) -> str:
    """Conv (no bias) + unfolded BatchNormalization with random running statistics.

    With Constant weights the Conv also gets a Constant->Reshape->Add bias, drawn from
    ``g.bias_rng``, and the BN running mean is shifted by that bias: both weight styles
    compute the same function from the same main-``rng`` weights.
    """
    y = conv(g, x, cin, cout, k, stride=stride, group=group)
    shift = None
    if g.const_weights:
        shift = uniform(g.bias_rng, -0.2, 0.2, cout)
        y = bias_add(g, y, shift)
    return batch_norm(g, y, cout, gamma=gamma, mean_shift=shift)


def hardswish(g: GraphBuilder, x: str) -> str:
    """``x * clip(x + 3, 0, 6) / 6`` as Add(3) -> Clip(0, 6) -> Div(6) -> Mul(x)."""
    t = g.op("Add", [x, g.scalar(3.0)])
    t = g.op("Clip", [t, g.scalar(0.0), g.scalar(6.0)])
    t = g.op("Div", [t, g.scalar(6.0)])
    return g.op("Mul", [x, t])


def paddle_hardswish(g: GraphBuilder, x: str) -> str:
    """Paddle2ONNX's HardSwish below opset 14: Add(3) -> Clip(0, 6) -> Mul(x, .) -> Div(6)."""
    t = g.op("Add", [x, g.scalar(3.0)])
    t = g.op("Clip", [t, g.scalar(0.0), g.scalar(6.0)])
    return g.op("Div", [g.op("Mul", [x, t]), g.scalar(6.0)])


def squeeze_excite(g: GraphBuilder, x: str, channels: int, gate_alpha: float = 0.2) -> str:
    """Paddle's SEModule: GlobalAveragePool -> Conv(c/4)+Relu -> Conv(c) -> HardSigmoid(gate_alpha, 0.5) -> Mul(x)."""
    mid = channels // 4
    s = g.op("GlobalAveragePool", [x])
    with g.scope("conv1"):
        s = g.op("Relu", [conv(g, s, channels, mid, 1, bias=uniform(g.rng, -0.1, 0.1, mid))])
    with g.scope("conv2"):
        s = conv(g, s, mid, channels, 1, bias=uniform(g.rng, -0.1, 0.1, channels))
    s = g.op("HardSigmoid", [s], alpha=gate_alpha, beta=0.5)
    return g.op("Mul", [x, s])


def silu(g: GraphBuilder, x: str) -> str:
    """``x * sigmoid(x)`` as Sigmoid -> Mul(x)."""
    return g.op("Mul", [x, g.op("Sigmoid", [x])])


def erf_gelu(g: GraphBuilder, x: str) -> str:
    """PyTorch exporter order: Div(sqrt 2) -> Erf -> Add(1) -> Mul(x) -> Mul(0.5)."""
    t = g.op("Div", [x, g.scalar(math.sqrt(2.0))])
    t = g.op("Erf", [t])
    t = g.op("Add", [t, g.scalar(1.0)])
    t = g.op("Mul", [x, t])
    return g.op("Mul", [t, g.scalar(0.5)])


def tanh_gelu(g: GraphBuilder, x: str) -> str:
    """``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` in HF ``gelu_new`` export order.

    Mul(x, 0.5); Pow(x, 3) -> Mul(0.044715) -> Add(x) -> Mul(sqrt(2/pi)) -> Tanh -> Add(1) -> Mul(half_x).
    """
    half_x = g.op("Mul", [x, g.scalar(0.5)])
    t = g.op("Pow", [x, g.scalar(3.0)])
    t = g.op("Mul", [t, g.scalar(0.044715)])
    t = g.op("Add", [x, t])
    t = g.op("Mul", [t, g.scalar(math.sqrt(2.0 / math.pi))])
    t = g.op("Tanh", [t])
    t = g.op("Add", [t, g.scalar(1.0)])
    return g.op("Mul", [half_x, t])


def layer_norm(g: GraphBuilder, x: str, hidden: int, eps: float = 1e-12) -> str:
    """Decomposed LayerNorm over the last axis (opset 17: ReduceMean axes as attribute).

    ReduceMean -> Sub -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul(gamma) -> Add(beta).
    """
    rng = g.rng
    gamma = (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
    beta = (0.05 * rng.standard_normal(hidden)).astype(np.float32)
    mean = g.op("ReduceMean", [x], axes=[-1], keepdims=1)
    d = g.op("Sub", [x, mean])
    var = g.op("ReduceMean", [g.op("Pow", [d, g.scalar(2.0)])], axes=[-1], keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [var, g.scalar(eps)])])
    y = g.op("Div", [d, std])
    y = g.op("Mul", [y, g.weight("weight", gamma)])
    return g.op("Add", [y, g.weight("bias", beta)])


def linear(g: GraphBuilder, x: str, cin: int, cout: int, std: float | None = None) -> str:
    """N-D ``MatMul(x, W[cin, cout]) + Add(bias)`` (the form transformers export for 3-D inputs)."""
    rng = g.rng
    w = rng.standard_normal((cin, cout)) * (std if std is not None else math.sqrt(1.0 / cin))
    b = 0.02 * rng.standard_normal(cout)
    y = g.op("MatMul", [x, g.weight("weight", w.astype(np.float32))])
    return g.op("Add", [y, g.weight("bias", b.astype(np.float32))])


# -- BatchNormalization statistics ------------------------------------------------------------
def _stats_graph(model: onnx.ModelProto, shape: tuple[int, ...]) -> tuple[onnx.ModelProto, list[onnx.NodeProto]]:
    """A copy of ``model`` whose BatchNormalizations normalize with the statistics of the data they see
    (as in training), and whose outputs are those per-channel means and variances, BN by BN.
    Nodes no statistic depends on are dropped; the input gets the fixed ``shape``."""
    nodes, outputs, bns = [], [], []
    for node in model.graph.node:
        if node.op_type != "BatchNormalization":
            nodes.append(node)
            continue
        x, scale, bias = node.input[:3]
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        p = f"{node.name}/stats"
        nodes += [
            helper.make_node("ReduceMean", [x], [f"{p}/mean4"], axes=[0, 2, 3], keepdims=1),
            helper.make_node("ReduceMean", [x], [f"{p}/mean"], axes=[0, 2, 3], keepdims=0),
            helper.make_node("Sub", [x, f"{p}/mean4"], [f"{p}/d"]),
            helper.make_node("Mul", [f"{p}/d", f"{p}/d"], [f"{p}/d2"]),
            helper.make_node("ReduceMean", [f"{p}/d2"], [f"{p}/var4"], axes=[0, 2, 3], keepdims=1),
            helper.make_node("ReduceMean", [f"{p}/d2"], [f"{p}/var"], axes=[0, 2, 3], keepdims=0),
            helper.make_node("Add", [f"{p}/var4", f"{p}/eps"], [f"{p}/ve"]),
            helper.make_node("Constant", [], [f"{p}/eps"], value=numpy_helper.from_array(np.float32(eps))),
            helper.make_node("Sqrt", [f"{p}/ve"], [f"{p}/std"]),
            helper.make_node("Div", [f"{p}/d", f"{p}/std"], [f"{p}/n"]),
            helper.make_node("Constant", [], [f"{p}/shape"], value=numpy_helper.from_array(np.array([1, -1, 1, 1]))),
            helper.make_node("Reshape", [scale, f"{p}/shape"], [f"{p}/scale"]),
            helper.make_node("Reshape", [bias, f"{p}/shape"], [f"{p}/bias"]),
            helper.make_node("Mul", [f"{p}/n", f"{p}/scale"], [f"{p}/y"]),
            helper.make_node("Add", [f"{p}/y", f"{p}/bias"], [node.output[0]]),
        ]
        outputs += [f"{p}/mean", f"{p}/var"]
        bns.append(node)
    producer = {out: n for n in nodes for out in n.output}
    needed, stack = set(), list(outputs)
    while stack:
        name = stack.pop()
        if name in needed or name not in producer:
            continue
        needed.add(name)
        stack.extend(producer[name].input)
    kept = [n for n in nodes if any(o in needed for o in n.output)]
    used = {name for n in kept for name in n.input}
    (inp,) = model.graph.input
    graph = helper.make_graph(
        kept, "bn_statistics",
        [helper.make_tensor_value_info(inp.name, onnx.TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs],
        [t for t in model.graph.initializer if t.name in used],
    )
    stats = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return stats, bns


def calibrate_batchnorm(model: onnx.ModelProto, shape: tuple[int, ...], seed: int) -> None:
    """Set every BatchNormalization's running mean and variance, in place, to the statistics of its input
    when the model sees standard-normal data of ``shape`` (as a trained network's are for its data), so
    activations keep their scale through any depth. One stock ORT run, single-threaded; the statistics
    are rounded to 10 mantissa bits, so the model bytes do not depend on the last bits of that run.
    For models with one float input, 4-D BN inputs and opset <= 17 (ReduceMean's axes attribute)."""
    import onnxruntime as ort

    stats, bns = _stats_graph(model, shape)
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(stats.SerializeToString(), so, providers=["CPUExecutionProvider"])
    (inp,) = model.graph.input
    x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    values = sess.run(None, {inp.name: x})
    tensors = {t.name: t for t in model.graph.initializer}
    tensors.update({n.output[0]: n.attribute[0].t for n in model.graph.node if n.op_type == "Constant"})
    for i, node in enumerate(bns):
        for name, value in ((node.input[3], values[2 * i]), (node.input[4], values[2 * i + 1])):
            rounded = ((value.astype(np.float32).view(np.uint32) + 0x1000) & 0xFFFFE000).view(np.float32)
            tensors[name].CopyFrom(numpy_helper.from_array(rounded, tensors[name].name))
