"""PP-OCR-style DB text detector: input ``input[batch, 3, 640, 640]``, output ``output[batch, 1, 640, 640]``.

Written the way Paddle2ONNX exports PaddleOCR's mobile detector: initializer weights, unfolded
BatchNormalization, HardSwish as ``Add(3) -> Clip(0, 6) -> Mul(x, .) -> Div(6)`` (below opset 14; stock
ORT does not fold it into its Convs), Resize with scales.

- Backbone: MobileNetV3-large at scale 0.5 (channels rounded to multiples of 8). Stem 3x3 s2
  Conv+BN+HardSwish; 15 residual units (1x1 expand Conv+BN+act, kxk depthwise Conv+BN+act,
  optional squeeze-excite ``GlobalAveragePool -> Conv -> Relu -> Conv -> HardSigmoid(0.2, 0.5) ->
  Mul``, 1x1 project Conv+BN, residual Add when shape is kept); a last 1x1 Conv+BN+HardSwish.
  Features at strides 4, 8, 16, 32 with 16, 24, 56, 480 channels.
- Neck (RSE-FPN, 96 channels): per level a 1x1 Conv and a residual squeeze-excite
  (``x + x * se(x)``); top-down ``Resize(nearest, x2) + Add``; per level a 3x3 Conv to 24 channels
  with its residual squeeze-excite; Resize x8, x4, x2 to stride 4 and Concat (96 channels).
- Head (DB, probability map only): 3x3 Conv+BN+Relu, two 2x2 stride-2 ConvTranspose (+BN+Relu
  after the first), Sigmoid.

BN running statistics are those of the data each BN sees (``calibrate_batchnorm``), as a trained
network's are, so activations keep their scale and the output depends on the input at any depth.
"""

from __future__ import annotations

import numpy as np
import onnx

from .builder import GraphBuilder
from .layers import batch_norm, calibrate_batchnorm, conv, conv_bn, he_normal, paddle_hardswish, squeeze_excite, uniform

SEED = 11
SIZE = 640
SCALE = 0.5
NECK = 96
# MobileNetV3-large units: (kernel, expand, out, squeeze-excite, activation, stride), before scaling
UNITS = (
    (3, 16, 16, False, "relu", 1),
    (3, 64, 24, False, "relu", 2),
    (3, 72, 24, False, "relu", 1),
    (5, 72, 40, True, "relu", 2),
    (5, 120, 40, True, "relu", 1),
    (5, 120, 40, True, "relu", 1),
    (3, 240, 80, False, "hardswish", 2),
    (3, 200, 80, False, "hardswish", 1),
    (3, 184, 80, False, "hardswish", 1),
    (3, 184, 80, False, "hardswish", 1),
    (3, 480, 112, True, "hardswish", 1),
    (3, 672, 112, True, "hardswish", 1),
    (5, 672, 160, True, "hardswish", 2),
    (5, 960, 160, True, "hardswish", 1),
    (5, 960, 160, True, "hardswish", 1),
)
LAST = 960


def make_divisible(v: float, divisor: int = 8) -> int:
    """PaddleOCR's channel rounding: nearest multiple of ``divisor``, never below 90% of ``v``."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def _act(g: GraphBuilder, x: str, act: str) -> str:
    return paddle_hardswish(g, x) if act == "hardswish" else g.op("Relu", [x])


def _residual_unit(g: GraphBuilder, x: str, cin: int, unit: tuple) -> tuple[str, int]:
    k, expand, out, se, act, stride = unit
    mid, cout = make_divisible(SCALE * expand), make_divisible(SCALE * out)
    with g.scope("expand_conv"):
        y = _act(g, conv_bn(g, x, cin, mid, 1), act)
    with g.scope("bottleneck_conv"):
        y = _act(g, conv_bn(g, y, mid, mid, k, stride=stride, group=mid), act)
    if se:
        with g.scope("mid_se"):
            y = squeeze_excite(g, y, mid)
    with g.scope("linear_conv"):
        y = conv_bn(g, y, mid, cout, 1)
    if stride == 1 and cin == cout:
        y = g.op("Add", [x, y])
    return y, cout


def backbone(g: GraphBuilder, x: str) -> list[tuple[str, int]]:
    """MobileNetV3-large x0.5; the (tensor, channels) feeding each stride-2 unit after the third, and the last."""
    cin = make_divisible(16 * SCALE)
    with g.scope("backbone"):
        with g.scope("conv"):
            x = paddle_hardswish(g, conv_bn(g, x, 3, cin, 3, stride=2))
        features = []
        for i, unit in enumerate(UNITS):
            if unit[-1] == 2 and i > 2:
                features.append((x, cin))
            with g.scope(f"stage{len(features)}_unit{i}"):
                x, cin = _residual_unit(g, x, cin, unit)
        last = make_divisible(SCALE * LAST)
        with g.scope("conv_last"):
            x = paddle_hardswish(g, conv_bn(g, x, cin, last, 1))
        features.append((x, last))
    return features


def _resize(g: GraphBuilder, x: str, factor: int) -> str:
    scales = g.weight("scales", np.array([1.0, 1.0, factor, factor], dtype=np.float32))
    return g.op("Resize", [x, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric",
                nearest_mode="floor")


def _rse_layer(g: GraphBuilder, x: str, cin: int, cout: int, k: int) -> str:
    """RSELayer with shortcut: bias-free kxk Conv, then ``y + y * se(y)``."""
    y = conv(g, x, cin, cout, k)
    with g.scope("se_block"):
        return g.op("Add", [y, squeeze_excite(g, y, cout)])


def neck(g: GraphBuilder, features: list[tuple[str, int]]) -> str:
    """RSE-FPN to ``NECK`` channels at stride 4."""
    with g.scope("neck"):
        ins = []
        for i, (f, c) in enumerate(features):
            with g.scope(f"ins_conv{i}"):
                ins.append(_rse_layer(g, f, c, NECK, 1))
        outs = [ins[3]]
        for i in (2, 1, 0):
            outs.insert(0, g.op("Add", [ins[i], _resize(g, outs[0], 2)]))
        fused = []
        for i, t in enumerate(outs):
            with g.scope(f"inp_conv{i}"):
                p = _rse_layer(g, t, NECK, NECK // 4, 3)
            fused.append(_resize(g, p, 2**i) if i else p)
        return g.op("Concat", fused[::-1], axis=1)


def _conv_transpose(g: GraphBuilder, x: str, cin: int, cout: int) -> str:
    w = g.weight("weight", he_normal(g.rng, (cin, cout, 2, 2), fan_in=cin))
    b = g.weight("bias", uniform(g.rng, -0.1, 0.1, cout))
    return g.op("ConvTranspose", [x, w, b], kernel_shape=[2, 2], strides=[2, 2])


def head(g: GraphBuilder, x: str) -> str:
    """DB head's binarize branch: stride 4 -> full resolution probability map."""
    mid = NECK // 4
    with g.scope("head"):
        with g.scope("conv1"):
            y = g.op("Relu", [conv_bn(g, x, NECK, mid, 3)])
        with g.scope("conv2"):
            y = g.op("Relu", [batch_norm(g, _conv_transpose(g, y, mid, mid), mid)])
        with g.scope("conv3"):
            y = _conv_transpose(g, y, mid, 1)
        return g.op("Sigmoid", [y])


def make() -> onnx.ModelProto:
    """Build the detector (initializer weights, seeded; BN statistics calibrated on one input)."""
    g = GraphBuilder("db_text_detector", SEED)
    x = g.input("input", ["batch", 3, SIZE, SIZE])
    y = head(g, neck(g, backbone(g, x)))
    g.output(y, "output", ["batch", 1, SIZE, SIZE])
    model = g.model()
    calibrate_batchnorm(model, (1, 3, SIZE, SIZE), SEED)
    return model
