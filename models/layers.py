"""Layers shared by the zoo networks, written out in the op order real exporters use.

Weights come from ``g.rng``; layers draw in a fixed order, so a network's weights depend
only on its seed and not on the weight style.
"""

from __future__ import annotations

import math

import numpy as np

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
    scale = uniform(g.rng, *gamma, cout)
    beta = uniform(g.rng, -0.1, 0.1, cout)
    mean = uniform(g.rng, -0.1, 0.1, cout)
    var = uniform(g.rng, 0.5, 1.5, cout)
    if g.const_weights:
        bias = uniform(g.bias_rng, -0.2, 0.2, cout)
        y = bias_add(g, y, bias)
        mean = mean + bias
    named = (("bn.weight", scale), ("bn.bias", beta), ("bn.running_mean", mean), ("bn.running_var", var))
    params = [g.weight(n, v) for n, v in named]
    return g.op("BatchNormalization", [y, *params], epsilon=1e-5)


def hardswish(g: GraphBuilder, x: str) -> str:
    """``x * clip(x + 3, 0, 6) / 6`` as Add(3) -> Clip(0, 6) -> Div(6) -> Mul(x)."""
    t = g.op("Add", [x, g.scalar(3.0)])
    t = g.op("Clip", [t, g.scalar(0.0), g.scalar(6.0)])
    t = g.op("Div", [t, g.scalar(6.0)])
    return g.op("Mul", [x, t])


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
