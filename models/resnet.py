"""ResNet-50 v1.5 (torchvision topology), Conv and BatchNormalization kept unfolded.

Stem: Conv 7x7/2 + BN + Relu + MaxPool 3x3/2. Bottleneck stages of 3, 4, 6, 3 blocks
(1x1 -> 3x3 with the stride (v1.5) -> 1x1, expansion 4), a 1x1/s Conv + BN shortcut on each
stage's first block, residual Add + Relu. GlobalAveragePool -> Flatten -> Gemm(1000).
53 Conv+BN groups. Input ``input[batch, 3, 224, 224]``, output ``output[batch, 1000]``.
"""

from __future__ import annotations

import math

import onnx

from .builder import GraphBuilder
from .layers import conv_bn

SEED = 50
STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # (width, blocks, stride)
EXPANSION = 4
NUM_CLASSES = 1000
# The last BN of each block gets a small scale, so the residual sum does not grow stage by stage.
LAST_BN_GAMMA = (0.1, 0.3)


def _bottleneck(g: GraphBuilder, x: str, cin: int, width: int, stride: int) -> str:
    cout = width * EXPANSION
    with g.scope("conv1"):
        y = g.op("Relu", [conv_bn(g, x, cin, width, 1)])
    with g.scope("conv2"):
        y = g.op("Relu", [conv_bn(g, y, width, width, 3, stride=stride)])
    with g.scope("conv3"):
        y = conv_bn(g, y, width, cout, 1, gamma=LAST_BN_GAMMA)
    if stride != 1 or cin != cout:
        with g.scope("downsample"):
            x = conv_bn(g, x, cin, cout, 1, stride=stride)
    return g.op("Relu", [g.op("Add", [y, x])])


def make(const_weights: bool = False) -> onnx.ModelProto:
    """Build ResNet-50; ``const_weights`` gives the Constant-node variant with Reshape->Add conv biases."""
    g = GraphBuilder("resnet50", SEED, const_weights=const_weights)
    x = g.input("input", ["batch", 3, 224, 224])
    with g.scope("stem"):
        x = g.op("Relu", [conv_bn(g, x, 3, 64, 7, stride=2)])
        x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for i, (width, blocks, stride) in enumerate(STAGES, start=1):
        for j in range(blocks):
            with g.scope(f"layer{i}"), g.scope(str(j)):
                x = _bottleneck(g, x, cin, width, stride if j == 0 else 1)
            cin = width * EXPANSION
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    with g.scope("fc"):
        w = g.rng.standard_normal((NUM_CLASSES, cin)) * math.sqrt(1.0 / cin)
        b = 0.01 * g.rng.standard_normal(NUM_CLASSES)
        x = g.op(
            "Gemm",
            [x, g.weight("weight", w.astype("float32")), g.weight("bias", b.astype("float32"))],
            transB=1,
        )
    g.output(x, "output", ["batch", NUM_CLASSES])
    return g.model()
