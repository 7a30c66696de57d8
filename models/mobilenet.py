"""MobileNetV3 inverted-residual blocks: input ``input[batch, 16, 112, 112]``, output ``output[batch, 80, 14, 14]``.

Each block: 1x1 expand Conv+BN+act, depthwise 3x3 Conv (group=channels)+BN+act, optional
squeeze-excite (GlobalAveragePool -> Conv -> Relu -> Conv -> HardSigmoid -> Mul), 1x1
project Conv+BN, residual Add when stride 1 and channels match. HardSwish is
Add(3) -> Clip(0, 6) -> Div(6) -> Mul(x); SiLU is Sigmoid -> Mul(x).

    block  in -> expand -> out  stride  act        SE   residual
    0      16 ->   64   -> 24     2     hardswish  no   no
    1      24 ->   72   -> 24     1     hardswish  yes  yes
    2      24 ->   72   -> 40     2     silu       yes  no
    3      40 ->  120   -> 40     1     silu       yes  yes
    4      40 ->  240   -> 80     2     hardswish  no   no
    5      80 ->  200   -> 80     1     hardswish  yes  yes
"""

from __future__ import annotations

import onnx

from .builder import GraphBuilder
from .layers import conv, conv_bn, hardswish, silu, uniform

SEED = 3
IN_CHANNELS, SIZE = 16, 112
# (expand, out, stride, activation, squeeze-excite)
BLOCKS = (
    (64, 24, 2, "hardswish", False),
    (72, 24, 1, "hardswish", True),
    (72, 40, 2, "silu", True),
    (120, 40, 1, "silu", True),
    (240, 80, 2, "hardswish", False),
    (200, 80, 1, "hardswish", True),
)
ACTS = {"hardswish": hardswish, "silu": silu}


def _make_divisible(v: int, divisor: int = 8) -> int:
    """torchvision's rounding of SE widths to a multiple of ``divisor``."""
    new_v = max(divisor, (v + divisor // 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def _squeeze_excite(g: GraphBuilder, x: str, channels: int) -> str:
    squeeze = _make_divisible(channels // 4)
    s = g.op("GlobalAveragePool", [x])
    with g.scope("fc1"):
        s = g.op("Relu", [conv(g, s, channels, squeeze, 1, bias=uniform(g.rng, -0.1, 0.1, squeeze))])
    with g.scope("fc2"):
        s = conv(g, s, squeeze, channels, 1, bias=uniform(g.rng, -0.1, 0.1, channels))
    s = g.op("HardSigmoid", [s], alpha=1.0 / 6.0, beta=0.5)
    return g.op("Mul", [x, s])


def _block(g: GraphBuilder, x: str, cin: int, expand: int, cout: int, stride: int, act: str, se: bool) -> str:
    with g.scope("expand"):
        y = ACTS[act](g, conv_bn(g, x, cin, expand, 1))
    with g.scope("depthwise"):
        y = ACTS[act](g, conv_bn(g, y, expand, expand, 3, stride=stride, group=expand))
    if se:
        with g.scope("se"):
            y = _squeeze_excite(g, y, expand)
    with g.scope("project"):
        y = conv_bn(g, y, expand, cout, 1, gamma=(0.3, 0.6))
    if stride == 1 and cin == cout:
        y = g.op("Add", [y, x])
    return y


def make(const_weights: bool = False) -> onnx.ModelProto:
    """Build the blocks; ``const_weights`` gives the Constant-node variant with Reshape->Add conv biases."""
    g = GraphBuilder("mobilenetv3_block", SEED, const_weights=const_weights)
    x = g.input("input", ["batch", IN_CHANNELS, SIZE, SIZE])
    cin, size = IN_CHANNELS, SIZE
    for i, (expand, cout, stride, act, se) in enumerate(BLOCKS):
        with g.scope(f"block{i}"):
            x = _block(g, x, cin, expand, cout, stride, act, se)
        cin, size = cout, size // stride
    g.output(x, "output", ["batch", cin, size, size])
    return g.model()
