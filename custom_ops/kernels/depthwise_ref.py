"""The depthwise convolution's filter packing and its float64 reference, numpy only: planning with the
ops library imports no numba (docs/ARCHITECTURE.md §9).

``FusedDepthwiseConvBlocked`` (``custom_ops/native/ops/depthwise_conv.py``) reads the filter of a
block of channels as K*K vectors of ``block`` lanes: memory [C / block, K, K, block], the layout ORT's
NCHWc transformer gives a depthwise filter (``pack_filter``).
"""

from __future__ import annotations

import numpy as np


def pack_filter(w: np.ndarray, block: int) -> np.ndarray:
    """w [C, 1, K, K] -> the same shape, memory [C / block, K, K, block] (float32)."""
    c, _, kh, kw = w.shape
    packed = w.reshape(c // block, block, kh, kw).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(packed.astype(np.float32)).reshape(c, 1, kh, kw)


def unpack_filter(wb: np.ndarray, block: int) -> np.ndarray:
    """The inverse of ``pack_filter``: memory [C / block, K, K, block] -> w [C, 1, K, K]."""
    c, _, kh, kw = wb.shape
    return np.ascontiguousarray(wb.reshape(c // block, kh, kw, block).transpose(0, 3, 1, 2)).reshape(c, 1, kh, kw)


def epilogue_reference(v: np.ndarray, act: str, alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
    """The op's epilogue on float64 values: "" none, relu, clip [alpha, beta], hard_sigmoid
    clip(alpha v + beta, 0, 1), hard_swish v * hard_sigmoid, quick_gelu v * sigmoid(alpha v), sigmoid."""
    if act == "relu":
        return np.maximum(v, 0.0)
    if act == "clip":
        return np.minimum(np.maximum(v, alpha), beta)
    if act in ("hard_sigmoid", "hard_swish"):
        t = np.clip(alpha * v + beta, 0.0, 1.0)
        return v * t if act == "hard_swish" else t
    if act == "quick_gelu":
        return v / (1.0 + np.exp(-alpha * v))
    if act == "sigmoid":
        return 1.0 / (1.0 + np.exp(-v))
    if act:
        raise ValueError(f"unknown epilogue {act!r}")
    return v


def depthwise_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, strides=(1, 1), pads=(0, 0, 0, 0),
                        act: str = "", alpha: float = 1.0, beta: float = 0.0, in_scale: float = 1.0,
                        in_shift: float = 0.0, out_scale: float = 1.0, out_shift: float = 0.0) -> np.ndarray:
    """Depthwise convolution in float64 of in_scale * x + in_shift: x [N, C, H, W], w [C, 1, K, K],
    b [C], strides [sh, sw], pads [top, left, bottom, right] (zeros), then the epilogue, then
    out_scale * y + out_shift."""
    n, c, h, wd = x.shape
    k = w.shape[-1]
    sh, sw = strides
    pt, pl, pb, pr = pads
    xp = np.pad(in_scale * x.astype(np.float64) + in_shift, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - k) // sh + 1
    ow = (wd + pl + pr - k) // sw + 1
    y = np.zeros((n, c, oh, ow)) + b.astype(np.float64)[None, :, None, None]
    for ky in range(k):
        for kx in range(k):
            tap = w[:, 0, ky, kx].astype(np.float64)[None, :, None, None]
            y += tap * xp[:, :, ky:ky + sh * (oh - 1) + 1:sh, kx:kx + sw * (ow - 1) + 1:sw]
    return out_scale * epilogue_reference(y, act, alpha, beta) + out_shift
