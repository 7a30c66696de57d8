"""PP-PicoDet-style layout detector: input ``image[batch, 3, 800, 608]``, outputs
``boxes[batch, 10105, 4]`` and ``scores[batch, 5, 10105]`` (5 layout classes, strides 8/16/32/64).

Constant-node weights (``GraphBuilder(const_weights=True)``: each Conv also gets a
Constant->Reshape->Add bias before its BatchNormalization); HardSwish written as Paddle2ONNX does
below opset 14, ``Add(x, 3) -> Clip(0, 6) -> Mul(x, .) -> Div(6)``, 94 of them.

- Backbone: PP-LCNet x1.0. Stem 3x3 s2 Conv+BN+HardSwish (16); 13 depthwise-separable blocks
  (kxk depthwise Conv+BN+HardSwish, squeeze-excite ``GlobalAveragePool -> Conv -> Relu -> Conv ->
  HardSigmoid -> Mul`` in the last two, 1x1 Conv+BN+HardSwish). Features at strides 8, 16, 32
  with 128, 256, 512 channels.
- Neck (CSP-PAN, 128 channels): 1x1 Conv per level; top-down ``Resize(nearest, x2) -> Concat ->
  CSP layer``; bottom-up depthwise-separable 5x5 s2 Conv -> Concat -> CSP layer; a stride-64
  level as the sum of two depthwise-separable 5x5 s2 Convs. CSP layer: two 1x1 Convs (main,
  short), a bottleneck (1x1 Conv, 5x5 depthwise-separable Conv) on main, Concat, 1x1 Conv.
- Head (GFL, shared class/box features): per level four 5x5 depthwise-separable Convs; effective
  squeeze-excite (``GlobalAveragePool -> Conv -> Sigmoid -> Mul -> 1x1 Conv+BN+SiLU``) then a 1x1
  Conv to the 5 class logits and Sigmoid; a 1x1 Conv to 4 x 8 distance bins. Distances: Softmax
  over the 8 bins, MatMul with 0..7, times the stride; boxes ``centre - lt``, ``centre + rb``.

BN running statistics are those of the data each BN sees (``layers.calibrate_batchnorm``).
"""

from __future__ import annotations

import numpy as np
import onnx

from .builder import GraphBuilder
from .layers import calibrate_batchnorm, conv, conv_bn, paddle_hardswish, silu, squeeze_excite, uniform
from .pplcnet import BLOCKS

SEED = 31
HEIGHT, WIDTH = 800, 608
CLASSES = 5
REG_MAX = 7
NECK = 128
STRIDES = (8, 16, 32, 64)
GAMMA = (0.2, 0.4)  # BN scales: HardSwish stays near its linear part, so ~100 layers stay well conditioned
FEATURES = (4, 10, 12)  # PP-LCNet x1.0 blocks (pplcnet.BLOCKS) whose outputs the neck reads


def _grid(stride: int) -> tuple[int, int]:
    """Feature map size at ``stride``: each stride-2 3x3/5x5 Conv with padding k//2 rounds up."""
    h, w = HEIGHT, WIDTH
    for _ in range(stride.bit_length() - 1):
        h, w = (h + 1) // 2, (w + 1) // 2
    return h, w


ANCHORS = sum(h * w for h, w in map(_grid, STRIDES))


def conv_bn_hs(g: GraphBuilder, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1) -> str:
    """Conv + BN (scales drawn from ``GAMMA``) + HardSwish."""
    return paddle_hardswish(g, conv_bn(g, x, cin, cout, k, stride=stride, group=group, gamma=GAMMA))


def dw_sep(g: GraphBuilder, x: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
    """Depthwise kxk Conv+BN+HardSwish, then pointwise 1x1 Conv+BN+HardSwish."""
    with g.scope("dw"):
        y = conv_bn_hs(g, x, cin, cin, k, stride, group=cin)
    with g.scope("pw"):
        return conv_bn_hs(g, y, cin, cout, 1)


def backbone(g: GraphBuilder, x: str) -> list[str]:
    """PP-LCNet x1.0 up to its last block; features at strides 8, 16, 32."""
    features = []
    with g.scope("backbone"):
        with g.scope("conv1"):
            x = conv_bn_hs(g, x, 3, 16, 3, 2)
        for i, (k, cin, cout, stride, se) in enumerate(BLOCKS):
            with g.scope(f"blocks.{i}"):
                with g.scope("dw_conv"):
                    x = conv_bn_hs(g, x, cin, cin, k, stride, group=cin)
                if se:
                    with g.scope("se"):
                        x = squeeze_excite(g, x, cin, gate_alpha=1.0 / 6.0)
                with g.scope("pw_conv"):
                    x = conv_bn_hs(g, x, cin, cout, 1)
            if i in FEATURES:
                features.append(x)
    return features


def _resize(g: GraphBuilder, x: str) -> str:
    roi = g.weight("roi", np.zeros(0, dtype=np.float32))
    scales = g.weight("scales", np.array([1.0, 1.0, 2.0, 2.0], dtype=np.float32))
    return g.op("Resize", [x, roi, scales], mode="nearest", coordinate_transformation_mode="asymmetric",
                nearest_mode="floor")


def csp_layer(g: GraphBuilder, x: str, cin: int, cout: int) -> str:
    mid = cout // 2
    with g.scope("main_conv"):
        main = conv_bn_hs(g, x, cin, mid, 1)
    with g.scope("short_conv"):
        short = conv_bn_hs(g, x, cin, mid, 1)
    with g.scope("blocks.0"):
        with g.scope("conv1"):
            main = conv_bn_hs(g, main, mid, mid, 1)
        with g.scope("conv2"):
            main = dw_sep(g, main, mid, mid, 5)
    with g.scope("final_conv"):
        return conv_bn_hs(g, g.op("Concat", [main, short], axis=1), 2 * mid, cout, 1)


def neck(g: GraphBuilder, features: list[str]) -> list[str]:
    """CSP-PAN: four ``NECK``-channel outputs at strides 8, 16, 32, 64."""
    with g.scope("neck"):
        ins = []
        for i, (f, c) in enumerate(zip(features, (128, 256, 512))):
            with g.scope(f"conv_t.{i}"):
                ins.append(conv_bn_hs(g, f, c, NECK, 1))
        inner = [ins[-1]]
        for i in (1, 0):
            with g.scope(f"top_down_blocks.{1 - i}"):
                cat = g.op("Concat", [_resize(g, inner[0]), ins[i]], axis=1)
                inner.insert(0, csp_layer(g, cat, 2 * NECK, NECK))
        outs = [inner[0]]
        for i in (0, 1):
            with g.scope(f"downsamples.{i}"):
                down = dw_sep(g, outs[-1], NECK, NECK, 5, 2)
            with g.scope(f"bottom_up_blocks.{i}"):
                outs.append(csp_layer(g, g.op("Concat", [down, inner[i + 1]], axis=1), 2 * NECK, NECK))
        with g.scope("first_top_conv"):
            top_in = dw_sep(g, ins[-1], NECK, NECK, 5, 2)
        with g.scope("second_top_conv"):
            top_out = dw_sep(g, outs[-1], NECK, NECK, 5, 2)
        outs.append(g.op("Add", [top_in, top_out]))
    return outs


def _ese(g: GraphBuilder, x: str) -> str:
    """Effective squeeze-excite: GlobalAveragePool -> Conv -> Sigmoid -> Mul(x) -> 1x1 Conv+BN+SiLU."""
    s = g.op("GlobalAveragePool", [x])
    with g.scope("fc"):
        s = conv(g, s, NECK, NECK, 1, bias=uniform(g.rng, -0.1, 0.1, NECK))
    y = g.op("Mul", [x, g.op("Sigmoid", [s])])
    with g.scope("conv"):
        return silu(g, conv_bn(g, y, NECK, NECK, 1))


def _head_conv(g: GraphBuilder, x: str, rows: int) -> str:
    """1x1 Conv with a bias (Constant->Reshape->Add) to ``rows`` outputs."""
    return conv(g, x, NECK, rows, 1, bias=uniform(g.rng, -1.0, 1.0, rows))


def head(g: GraphBuilder, levels: list[str]) -> tuple[str, str]:
    """GFL head with distance decoding: (boxes [b, N, 4], scores [b, CLASSES, N])."""
    bins = 4 * (REG_MAX + 1)
    scores, boxes = [], []
    with g.scope("head"):
        for i, (x, stride) in enumerate(zip(levels, STRIDES)):
            h, w = _grid(stride)
            with g.scope(f"conv_feat.{i}"):
                for j in range(4):
                    with g.scope(f"conv{j}"):
                        x = dw_sep(g, x, NECK, NECK, 5)
            with g.scope(f"cls_se.{i}"):
                cls_feat = _ese(g, x)
            with g.scope(f"head_cls.{i}"):
                cls = g.op("Sigmoid", [_head_conv(g, cls_feat, CLASSES)])
            scores.append(g.op("Reshape", [cls, g.ints([0, CLASSES, -1])]))
            with g.scope(f"head_reg.{i}"):
                reg = g.op("Reshape", [_head_conv(g, x, bins), g.ints([0, bins, -1])])
            with g.scope(f"decode.{i}"):
                reg = g.op("Reshape", [g.op("Transpose", [reg], perm=[0, 2, 1]), g.ints([0, h * w, 4, REG_MAX + 1])])
                reg = g.op("Softmax", [reg], axis=-1)
                project = g.weight("project", np.arange(REG_MAX + 1, dtype=np.float32).reshape(REG_MAX + 1, 1))
                dist = g.op("Reshape", [g.op("MatMul", [reg, project]), g.ints([0, h * w, 4])])
                dist = g.op("Mul", [dist, g.scalar(float(stride), "stride")])
                lt = g.op("Slice", [dist, g.ints([0], "starts"), g.ints([2], "ends"), g.ints([2], "axes")])
                rb = g.op("Slice", [dist, g.ints([2], "starts"), g.ints([4], "ends"), g.ints([2], "axes")])
                ys, xs = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
                centres = g.weight("anchors", (np.stack([xs.ravel(), ys.ravel()], 1) * stride).astype(np.float32))
                x1y1 = g.op("Add", [g.op("Neg", [lt]), centres])
                x2y2 = g.op("Add", [rb, centres])
                boxes.append(g.op("Concat", [x1y1, x2y2], axis=-1))
        return g.op("Concat", boxes, axis=1), g.op("Concat", scores, axis=2)


def make() -> onnx.ModelProto:
    """Build the detector (Constant-node weights, seeded; BN statistics calibrated on one input)."""
    g = GraphBuilder("picodet_layout", SEED, const_weights=True)
    x = g.input("image", ["batch", 3, HEIGHT, WIDTH])
    boxes, scores = head(g, neck(g, backbone(g, x)))
    g.output(boxes, "boxes", ["batch", ANCHORS, 4])
    g.output(scores, "scores", ["batch", CLASSES, ANCHORS])
    model = g.model()
    calibrate_batchnorm(model, (1, 3, HEIGHT, WIDTH), SEED)
    return model
