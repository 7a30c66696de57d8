"""YOLOv8n-style detector: input ``images[batch, 3, 320, 320]``, output ``output0[batch, 84, 2100]``.

Written the way ultralytics exports YOLOv8n with torch: initializer weights, every Conv carries the
BatchNormalization folded into its bias (the exporter fuses it) followed by SiLU as
``Sigmoid -> Mul(x)``, Upsample as ``Resize(nearest, scales 2)``. Width 0.25, depth 0.33:

- Backbone: Conv 3x3 s2 (16), Conv s2 (32), C2f(32, n=1), Conv s2 (64), C2f(64, n=2), Conv s2
  (128), C2f(128, n=2), Conv s2 (256), C2f(256, n=1), SPPF(256: 1x1 Conv, MaxPool 5x5 three
  times, Concat, 1x1 Conv). C2f: 1x1 Conv, Split in two halves, ``n`` bottlenecks on the second
  (two 3x3 Convs, residual Add in the backbone), Concat of all, 1x1 Conv.
- Neck (PAN): Resize x2 + Concat + C2f twice down to stride 8 (64 channels), then 3x3 s2 Conv +
  Concat + C2f twice back up (128, 256 channels); no residual Add in the neck's C2f.
- Detect head per stride 8, 16, 32: box branch (two 3x3 Convs to 64, 1x1 Conv to 4 x 16 bins),
  class branch (two 3x3 Convs to 80, 1x1 Conv to 80 classes); Concat, Reshape, Concat over levels,
  Split into box (64) and class (80) rows. DFL: Reshape [b, 4, 16, N] -> Transpose -> Softmax over
  the 16 bins -> 1x1 Conv with weights 0..15 -> Reshape [b, 4, N]. Box decode: Split, Sub / Add
  with anchor points, Add -> Div(2) (centre), Sub (size), Concat, Mul(strides). Sigmoid on the
  classes, Concat to [b, 84, N].
"""

from __future__ import annotations

import numpy as np
import onnx

from .builder import GraphBuilder
from .layers import he_normal, silu, uniform

SEED = 23
SIZE = 320
CLASSES = 80
REG_MAX = 16
STRIDES = (8, 16, 32)
ANCHORS = sum((SIZE // s) ** 2 for s in STRIDES)


def conv_silu(g: GraphBuilder, x: str, cin: int, cout: int, k: int, stride: int = 1) -> str:
    """Conv (BN folded into its bias) + SiLU; "same" padding.

    Gain 2.2 keeps activations near unit scale through all 64 Convs without BN (2.0 lets them
    decay towards the biases, 2.5 lets them grow with depth).
    """
    w = g.weight("conv.weight", he_normal(g.rng, (cout, cin, k, k), fan_in=cin * k * k, gain=2.2))
    b = g.weight("conv.bias", uniform(g.rng, -0.2, 0.2, cout))
    y = g.op("Conv", [x, w, b], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
    return silu(g, y)


def c2f(g: GraphBuilder, x: str, cin: int, cout: int, n: int, shortcut: bool) -> str:
    """CSP bottleneck with two convolutions: cv1, Split, ``n`` bottlenecks, Concat, cv2."""
    half = cout // 2
    with g.scope("cv1"):
        y = conv_silu(g, x, cin, 2 * half, 1)
    parts = list(_split(g, y, [half, half], axis=1))
    for i in range(n):
        with g.scope(f"m.{i}"):
            t = parts[-1]
            with g.scope("cv1"):
                b = conv_silu(g, t, half, half, 3)
            with g.scope("cv2"):
                b = conv_silu(g, b, half, half, 3)
            parts.append(g.op("Add", [t, b]) if shortcut else b)
    cat = g.op("Concat", parts, axis=1)
    with g.scope("cv2"):
        return conv_silu(g, cat, (2 + n) * half, cout, 1)


def _split(g: GraphBuilder, x: str, sizes: list[int], axis: int) -> list[str]:
    """A multi-output Split (opset 13+: sizes as an input); exporter-style output names."""
    name = g._node_name("Split")
    outs = [g._unique(f"{name}_output_{i}") for i in range(len(sizes))]
    g.nodes.append(onnx.helper.make_node("Split", [x, g.ints(sizes, "split")], outs, name=name, axis=axis))
    return outs


def sppf(g: GraphBuilder, x: str, c: int) -> str:
    """SPPF: 1x1 Conv to c/2, MaxPool 5x5 s1 three times in a row, Concat of the four, 1x1 Conv."""
    with g.scope("cv1"):
        y = conv_silu(g, x, c, c // 2, 1)
    pools = [y]
    for _ in range(3):
        pools.append(g.op("MaxPool", [pools[-1]], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]))
    with g.scope("cv2"):
        return conv_silu(g, g.op("Concat", pools, axis=1), 2 * c, c, 1)


def _upsample(g: GraphBuilder, x: str) -> str:
    scales = g.weight("scales", np.array([1.0, 1.0, 2.0, 2.0], dtype=np.float32))
    return g.op("Resize", [x, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric",
                nearest_mode="floor", cubic_coeff_a=-0.75)


def backbone_and_neck(g: GraphBuilder, x: str) -> list[tuple[str, int]]:
    """Layers 0-21 of yolov8.yaml at n scale; the (tensor, channels) at strides 8, 16, 32."""
    layers: list[str] = []

    def add(t: str) -> str:
        layers.append(t)
        return t

    with g.scope("model.0"):
        add(conv_silu(g, x, 3, 16, 3, 2))
    for i, (cin, cout, n) in enumerate(((16, 32, 1), (32, 64, 2), (64, 128, 2), (128, 256, 1))):
        with g.scope(f"model.{2 * i + 1}"):
            t = add(conv_silu(g, layers[-1], cin, cout, 3, 2))
        with g.scope(f"model.{2 * i + 2}"):
            add(c2f(g, t, cout, cout, n, shortcut=True))
    with g.scope("model.9"):
        add(sppf(g, layers[-1], 256))
    # top-down: (upsampled layer, lateral layer, concat channels, C2f out)
    for up, lateral, cin, cout in ((9, 6, 384, 128), (12, 4, 192, 64)):
        k = len(layers)
        with g.scope(f"model.{k}"):
            add(_upsample(g, layers[up]))
        with g.scope(f"model.{k + 1}"):
            add(g.op("Concat", [layers[-1], layers[lateral]], axis=1))
        with g.scope(f"model.{k + 2}"):
            add(c2f(g, layers[-1], cin, cout, 1, shortcut=False))
    # bottom-up: (down-sampled layer, its channels, lateral layer, concat channels, C2f out)
    for down, c, lateral, cin, cout in ((15, 64, 12, 192, 128), (18, 128, 9, 384, 256)):
        k = len(layers)
        with g.scope(f"model.{k}"):
            add(conv_silu(g, layers[down], c, c, 3, 2))
        with g.scope(f"model.{k + 1}"):
            add(g.op("Concat", [layers[-1], layers[lateral]], axis=1))
        with g.scope(f"model.{k + 2}"):
            add(c2f(g, layers[-1], cin, cout, 1, shortcut=False))
    return [(layers[15], 64), (layers[18], 128), (layers[21], 256)]


def _anchors() -> tuple[np.ndarray, np.ndarray]:
    """Anchor points [1, 2, N] (cell centres, grid units) and strides [1, N], level by level."""
    points, strides = [], []
    for s in STRIDES:
        n = SIZE // s
        ys, xs = np.meshgrid(np.arange(n) + 0.5, np.arange(n) + 0.5, indexing="ij")
        points.append(np.stack([xs.ravel(), ys.ravel()]))
        strides.append(np.full(n * n, s))
    return (np.concatenate(points, axis=1)[None].astype(np.float32),
            np.concatenate(strides)[None].astype(np.float32))


def detect(g: GraphBuilder, features: list[tuple[str, int]]) -> str:
    """Detect head, DFL and box decode: [b, 4 + CLASSES, ANCHORS]."""
    c2, c3, box_rows = max(16, features[0][1] // 4, 4 * REG_MAX), max(features[0][1], min(CLASSES, 100)), 4 * REG_MAX
    with g.scope("model.22"):
        levels = []
        for i, (x, c) in enumerate(features):
            branches = []
            for branch, mid, rows in (("cv2", c2, box_rows), ("cv3", c3, CLASSES)):
                with g.scope(f"{branch}.{i}"):
                    with g.scope("0"):
                        y = conv_silu(g, x, c, mid, 3)
                    with g.scope("1"):
                        y = conv_silu(g, y, mid, mid, 3)
                    with g.scope("2"):
                        w = g.weight("weight", he_normal(g.rng, (rows, mid, 1, 1), fan_in=mid, gain=1.0))
                        b = g.weight("bias", uniform(g.rng, -1.0, 1.0, rows))
                        branches.append(g.op("Conv", [y, w, b], kernel_shape=[1, 1]))
            level = g.op("Concat", branches, axis=1)
            levels.append(g.op("Reshape", [level, g.ints([-1, box_rows + CLASSES, (SIZE // STRIDES[i]) ** 2])]))
        cat = g.op("Concat", levels, axis=2)
        box, cls = _split(g, cat, [box_rows, CLASSES], axis=1)
        with g.scope("dfl"):
            d = g.op("Reshape", [box, g.ints([-1, 4, REG_MAX, ANCHORS])])
            d = g.op("Softmax", [g.op("Transpose", [d], perm=[0, 2, 1, 3])], axis=1)
            bins = g.weight("conv.weight", np.arange(REG_MAX, dtype=np.float32).reshape(1, REG_MAX, 1, 1))
            d = g.op("Reshape", [g.op("Conv", [d, bins], kernel_shape=[1, 1]), g.ints([-1, 4, ANCHORS])])
        points, strides = _anchors()
        lt, rb = _split(g, d, [2, 2], axis=1)
        anchor = g.weight("anchors", points)
        x1y1 = g.op("Sub", [anchor, lt])
        x2y2 = g.op("Add", [anchor, rb])
        centre = g.op("Div", [g.op("Add", [x1y1, x2y2]), g.scalar(2.0)])
        size = g.op("Sub", [x2y2, x1y1])
        dbox = g.op("Mul", [g.op("Concat", [centre, size], axis=1), g.weight("strides", strides)])
        return g.op("Concat", [dbox, g.op("Sigmoid", [cls])], axis=1)


def make() -> onnx.ModelProto:
    """Build the detector (initializer weights, seeded)."""
    g = GraphBuilder("yolov8n", SEED)
    x = g.input("images", ["batch", 3, SIZE, SIZE])
    g.output(detect(g, backbone_and_neck(g, x)), "output0", ["batch", 4 + CLASSES, ANCHORS])
    return g.model()
