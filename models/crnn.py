"""A PP-OCR-style text recognizer (CRNN/CTC) with a dynamic width, as Paddle2ONNX writes it at opset 11.

Input ``input[batch, 3, 48, width]``, output ``output[batch, steps, 97]`` (``steps = ceil(width / 2) // 2``,
80 at width 320, 25 at width 100), a Softmax over the classes.

    backbone  3x3 Conv stride 2 + BN + HardSwish, then depthwise-separable blocks (depthwise kxk
              Conv + BN + HardSwish [+ squeeze-excite], pointwise 1x1 Conv + BN + HardSwish) whose
              strides (2, 1) halve the height only, then AveragePool (3, 2): height 48 -> 1
    neck      1x1 Conv + BN + HardSwish; flatten to [B, C, H*W'] and Transpose to [B, H*W', C];
              a residual MatMul+Add -> HardSwish -> MatMul+Add mixer; Reshape to [0, H, W', C]
              (PP-OCR's SVTR neck ``z.reshape([0, H, W, C])``), Transpose to [B, C, H, W']
    head      Reshape [B, C, 1, W'] -> [B, C, W'], Transpose -> [B, W', C], MatMul+Add, MatMul+Add,
              Softmax(axis=2)

Every Reshape target is computed at run time: Shape -> Gather (scalar index) -> Unsqueeze -> Concat.
The neck's Reshape of [B, H*W', C] to [0, H, W', C] takes H, W' and C from the Shape of the tensor
before the mixer, so its target is right only when the whole graph ran on one input; a target
frozen for one width fails at another (``Input shape:{1,W',C}, requested shape:{1,1,W'',C}``).

HardSwish is decomposed two ways: HardSigmoid(1/6, 0.5) -> Mul(x) in the backbone blocks (the form
Paddle2ONNX writes below opset 14), Add(3) -> Clip(0, 6) -> Div(6) -> Mul(x) in the stem and neck.

BN running statistics are those of the data each BN sees at width 320 (``layers.calibrate_batchnorm``),
as a trained network's are, so activations keep their scale and the output depends on the input.
"""

from __future__ import annotations

import numpy as np
import onnx

from .builder import GraphBuilder
from .layers import batch_norm, calibrate_batchnorm, hardswish, he_normal, linear, squeeze_excite

SEED = 48
OPSET = 11
HEIGHT = 48
WIDTH = 320  # the width the BN statistics are calibrated at
CLASSES = 97
NECK = 128
HEAD = 96
# (kernel, in, out, (stride_h, stride_w), squeeze-excite)
BLOCKS = (
    (3, 16, 32, (1, 1), False),
    (3, 32, 64, (2, 1), False),
    (3, 64, 64, (1, 1), False),
    (3, 64, 128, (2, 1), False),
    (5, 128, 128, (1, 1), True),
    (3, 128, 256, (2, 1), False),
    (5, 256, 256, (1, 1), True),
)


def _conv_bn_hardswish(
    g: GraphBuilder, x: str, cin: int, cout: int, k: int, stride: tuple[int, int], form: str, group: int = 1
) -> str:
    """Bias-free Conv (strides ``(sh, sw)``, "same" padding) + BatchNormalization + HardSwish in ``form``."""
    w = he_normal(g.rng, (cout, cin // group, k, k), fan_in=cin // group * k * k)
    attrs = dict(kernel_shape=[k, k], strides=list(stride), pads=[k // 2] * 4, group=group)
    y = batch_norm(g, g.op("Conv", [x, g.weight("weight", w)], **attrs), cout)
    if form == "hardsigmoid":  # the form Paddle2ONNX writes below opset 14
        return g.op("Mul", [y, g.op("HardSigmoid", [y], alpha=1.0 / 6.0, beta=0.5)])
    return hardswish(g, y)


def _dims(g: GraphBuilder, x: str, axes: tuple[int, ...]) -> list[str]:
    """``[x.shape[a]]`` for each axis as 1-element int64 tensors: Shape -> Gather(scalar) -> Unsqueeze."""
    shape = g.op("Shape", [x])
    dims = []
    for axis in axes:
        index = g.weight("index", np.array(axis, dtype=np.int64))
        dims.append(g.op("Unsqueeze", [g.op("Gather", [shape, index], axis=0)], axes=[0]))
    return dims


def _reshape(g: GraphBuilder, x: str, parts: list[str]) -> str:
    return g.op("Reshape", [x, g.op("Concat", parts, axis=0)])


def _backbone(g: GraphBuilder, x: str) -> str:
    with g.scope("conv1"):
        x = _conv_bn_hardswish(g, x, 3, 16, 3, (2, 2), "clip")
    for i, (k, cin, cout, stride, se) in enumerate(BLOCKS):
        with g.scope(f"block{i}"):
            with g.scope("dw"):
                x = _conv_bn_hardswish(g, x, cin, cin, k, stride, "hardsigmoid", group=cin)
            if se:
                with g.scope("se"):
                    x = squeeze_excite(g, x, cin, gate_alpha=1.0 / 6.0)
            with g.scope("pw"):
                x = _conv_bn_hardswish(g, x, cin, cout, 1, (1, 1), "hardsigmoid")
    return g.op("AveragePool", [x], kernel_shape=[3, 2], strides=[3, 2])


def _neck(g: GraphBuilder, x: str) -> str:
    with g.scope("conv1x1"):
        y = _conv_bn_hardswish(g, x, BLOCKS[-1][2], NECK, 1, (1, 1), "clip")
    b, c, h, w = _dims(g, y, (0, 1, 2, 3))
    z = g.op("Transpose", [_reshape(g, y, [b, c, g.ints([-1])])], perm=[0, 2, 1])  # [B, H*W', C]
    with g.scope("mixer"):
        with g.scope("fc1"):
            t = hardswish(g, linear(g, z, NECK, 2 * NECK))
        with g.scope("fc2"):
            t = linear(g, t, 2 * NECK, NECK)
        z = g.op("Add", [z, t])
    # z.reshape([0, H, W', C]) with H, W', C read before the mixer; 0 copies the batch dim
    return g.op("Transpose", [_reshape(g, z, [g.ints([0]), h, w, c])], perm=[0, 3, 1, 2])  # [B, C, H, W']


def _head(g: GraphBuilder, x: str) -> str:
    b, c, w = _dims(g, x, (0, 1, 3))
    seq = g.op("Transpose", [_reshape(g, x, [b, c, w])], perm=[0, 2, 1])  # [B, W', C]
    with g.scope("fc1"):
        seq = linear(g, seq, NECK, HEAD)
    with g.scope("fc2"):
        seq = linear(g, seq, HEAD, CLASSES, std=0.3)
    return g.op("Softmax", [seq], axis=2)


def make() -> onnx.ModelProto:
    """Build the recognizer with initializer weights, opset 11 (BN statistics calibrated at width ``WIDTH``)."""
    g = GraphBuilder("crnn_recognizer", SEED, opset=OPSET)
    x = g.input("input", ["batch", 3, HEIGHT, "width"])
    with g.scope("backbone"):
        x = _backbone(g, x)
    with g.scope("neck"):
        x = _neck(g, x)
    with g.scope("head"):
        x = _head(g, x)
    g.output(x, "output", ["batch", "steps", CLASSES])
    model = g.model()
    calibrate_batchnorm(model, (1, 3, HEIGHT, WIDTH), SEED)
    return model
