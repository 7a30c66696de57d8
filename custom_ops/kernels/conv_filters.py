"""Filters of the blocked convolution kernels, prepared when a graph is planned, and the float64
references of what those kernels compute. numpy only: planning with the ops library imports no
numba (docs/ARCHITECTURE.md §9).

Winograd F(4x4, 3x3) (``custom_ops/kernels/winograd.py``): per 4x4 output tile from a 6x6 patch,

    Y = AT [ sum_c (G w G^T)[oc, c] * (BT d_c BT^T) ] AT^T        (elementwise product per position)

on the points 0, 1, -1, 2, -2 and infinity. 2x2 stride-2 ConvTranspose
(``custom_ops/native/ops/deconv_s2.py``): the filter as rows (o, a, b).
"""

from __future__ import annotations

import numpy as np

BT = ((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0),
      (0, -2, -1, 2, 1, 0), (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1))
G = ((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6),
     (1 / 24, 1 / 12, 1 / 6), (1 / 24, -1 / 12, 1 / 6), (0, 0, 1))
AT = ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1))
TILE, ALPHA = 4, 6  # output tile side, input patch side
POSITIONS = ALPHA * ALPHA


def transform_filter(w: np.ndarray) -> np.ndarray:
    """w [Cout, Cin, 3, 3] -> U [36, Cin, Cout] float32: G w G^T per channel pair, position-major
    (computed in float64)."""
    g = np.array(G, np.float64)
    u = np.einsum("xa,oiab,yb->xyio", g, w.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(POSITIONS, w.shape[1], w.shape[0]).astype(np.float32))


def conv3x3_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """3x3, stride 1, pads 1 in float64: x [N, Cin, H, W], w [Cout, Cin, 3, 3], b [Cout]."""
    n, _, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    y = np.zeros((n, w.shape[0], h, wd)) + b.astype(np.float64)[None, :, None, None]
    for i in range(3):
        for j in range(3):
            y += np.einsum("oc,nchw->nohw", w[:, :, i, j].astype(np.float64), xp[:, :, i:i + h, j:j + wd])
    return y


def pack_deconv_filter(w: np.ndarray) -> np.ndarray:
    """w [Cin, Cout, 2, 2] (ONNX ConvTranspose) -> Wt [4 * Cout, Cin], rows (o, a, b)."""
    cin, cout = w.shape[:2]
    return np.ascontiguousarray(w.transpose(1, 2, 3, 0).reshape(4 * cout, cin).astype(np.float32))


def deconv_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """2x2 stride-2 ConvTranspose in float64: x [N, Cin, H, W] -> [N, Cout, 2H, 2W]."""
    n, _, h, wd = x.shape
    y = np.einsum("nchw,coab->nohawb", x.astype(np.float64), w.astype(np.float64))
    return y.reshape(n, w.shape[1], 2 * h, 2 * wd) + b.astype(np.float64)[None, :, None, None]
