"""Row reductions the native normalization kernels share (float32 in, float32 sums).

Only the sum is reassociated (``fastmath={"reassoc"}``), so that it vectorizes; the terms are exact
float32 operations."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, error_model="numpy", cache=True, fastmath={"reassoc"})
def row_sum(row):
    """sum(row)."""
    total = np.float32(0.0)
    for k in range(row.shape[0]):
        total += row[k]
    return total


@njit(nogil=True, error_model="numpy", cache=True, fastmath={"reassoc"})
def squared_deviation(row, mean):
    """sum((row - mean)^2)."""
    total = np.float32(0.0)
    for k in range(row.shape[0]):
        t = row[k] - mean
        total += t * t
    return total
