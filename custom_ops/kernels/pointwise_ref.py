"""The pointwise (1x1) convolution's filter packing, numpy only: planning with the ops library imports
no numba (docs/ARCHITECTURE.md §9).

``FusedPointwiseConvBlocked`` (``custom_ops/native/ops/pointwise_conv.py``) reads the filter in panels
of ``PANEL`` output blocks (the last may have one), each [Cin, blocks in the panel, block]: per input
channel the vectors of ``kernels.pointwise.pw_tile``'s output blocks side by side.
"""

from __future__ import annotations

import numpy as np

PANEL = 2  # output blocks per panel: V of pw_tile


def pack_filter(w: np.ndarray, block: int) -> np.ndarray:
    """w [Cout, Cin] -> the same shape, memory: panels of PANEL output blocks, each [Cin, blocks, block]
    (float32)."""
    cout, cin = w.shape
    panels = []
    for c0 in range(0, cout, PANEL * block):
        part = w[c0:c0 + PANEL * block]  # [v * block + l, ci]
        panels.append(part.reshape(-1, block, cin).transpose(2, 0, 1).reshape(-1))
    return np.ascontiguousarray(np.concatenate(panels).reshape(cout, cin), dtype=np.float32)
