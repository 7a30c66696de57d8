"""A PP-LCNet x1.0 image classifier as Paddle2ONNX writes it at opset 15.

Input ``input[batch, 3, 224, 224]``, output ``output[batch, 1000]``. Every Conv is bias-free and
followed by an unfolded BatchNormalization; HardSwish is the ONNX ``HardSwish`` op (opset 14+).

    stem    3x3 Conv stride 2, 3 -> 16, BN, HardSwish
    13 depthwise-separable blocks: depthwise kxk Conv (group = channels) + BN + HardSwish,
            [squeeze-excite], pointwise 1x1 Conv + BN + HardSwish
    head    GlobalAveragePool -> 1x1 Conv 512 -> 1280 (no BN) -> HardSwish -> Flatten -> Gemm 1000

Squeeze-excite (the last two blocks): GlobalAveragePool -> 1x1 Conv(c -> c/4, bias) -> Relu ->
1x1 Conv(c/4 -> c, bias) -> HardSigmoid(1/6, 0.5) -> Mul(x). The Gemm keeps Paddle's weight layout
``[in, out]`` (no ``transB``).

BN running statistics are those of the data each BN sees (``layers.calibrate_batchnorm``), as a
trained network's are, so activations keep their scale and the output depends on the input.
"""

from __future__ import annotations

import onnx

from .builder import GraphBuilder
from .layers import calibrate_batchnorm, conv, conv_bn, he_normal, squeeze_excite, uniform

SEED = 15
OPSET = 15
CLASSES = 1000
LAST_CONV = 1280
# (kernel, in, out, stride, squeeze-excite): PP-LCNet's NET_CONFIG at scale 1.0
BLOCKS = (
    (3, 16, 32, 1, False),
    (3, 32, 64, 2, False),
    (3, 64, 64, 1, False),
    (3, 64, 128, 2, False),
    (3, 128, 128, 1, False),
    (3, 128, 256, 2, False),
    *[(5, 256, 256, 1, False)] * 5,
    (5, 256, 512, 2, True),
    (5, 512, 512, 1, True),
)


def _conv_bn_hardswish(g: GraphBuilder, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1) -> str:
    """Bias-free Conv ("same" padding) + BatchNormalization + HardSwish (the op)."""
    return g.op("HardSwish", [conv_bn(g, x, cin, cout, k, stride=stride, group=group)])


def make() -> onnx.ModelProto:
    """Build the classifier with initializer weights, opset 15 (BN statistics calibrated on one input)."""
    g = GraphBuilder("pplcnet_classifier", SEED, opset=OPSET)
    x = g.input("input", ["batch", 3, 224, 224])
    with g.scope("conv1"):
        x = _conv_bn_hardswish(g, x, 3, 16, 3, stride=2)
    for i, (k, cin, cout, stride, se) in enumerate(BLOCKS):
        with g.scope(f"blocks{i}"):
            with g.scope("dw_conv"):
                x = _conv_bn_hardswish(g, x, cin, cin, k, stride=stride, group=cin)
            if se:
                with g.scope("se"):
                    x = squeeze_excite(g, x, cin, gate_alpha=1.0 / 6.0)
            with g.scope("pw_conv"):
                x = _conv_bn_hardswish(g, x, cin, cout, 1)
    cin = BLOCKS[-1][2]
    x = g.op("GlobalAveragePool", [x])
    with g.scope("last_conv"):
        x = g.op("HardSwish", [conv(g, x, cin, LAST_CONV, 1)])
    x = g.op("Flatten", [x], axis=1)
    with g.scope("fc"):
        w = g.weight("weight", he_normal(g.rng, (LAST_CONV, CLASSES), fan_in=LAST_CONV, gain=1.0))
        b = g.weight("bias", uniform(g.rng, -0.05, 0.05, CLASSES))
        x = g.op("Gemm", [x, w, b])
    g.output(x, "output", ["batch", CLASSES])
    model = g.model()
    calibrate_batchnorm(model, (1, 3, 224, 224), SEED)
    return model
