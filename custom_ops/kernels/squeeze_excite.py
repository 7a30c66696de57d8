"""Squeeze-and-excitation in numpy: the reference of the native ``FusedSqueezeExciteBlocked`` and the
plain 1x1 weights read back from ORT's blocked filters (docs/ARCHITECTURE.md §9). numpy only: the
layout planner imports it with the ops library loaded and no numba.

On a plain tensor x [N, C, H, W], with FC1 weights w1 [Cr, C], b1 [Cr] and FC2 weights w2 [C, Cr],
b2 [C] (the 1x1 convolutions' filters without their 1x1 dims):

    m[n, c] = mean over (h, w) of x[n, c, h, w]
    z[n, r] = act(sum_c w1[r, c] m[n, c] + b1[r])         act: none | relu | hardswish | silu | sigmoid
    s[n, c] = gate(sum_r w2[c, r] z[n, r] + b2[c])        gate: hardsigmoid(alpha, beta) | sigmoid
    y = x * s                                             (residual: y = x * s + x; addend a: y += a)
"""

from __future__ import annotations

import numpy as np

ACTIVATIONS = ("relu", "hardswish", "silu", "sigmoid")  # FC1's, besides none
GATES = ("hardsigmoid", "sigmoid")


def _act(v: np.ndarray, act: str) -> np.ndarray:
    if act == "relu":
        return np.maximum(v, 0.0)
    if act == "hardswish":
        return v * np.clip(v / 6.0 + 0.5, 0.0, 1.0)
    if act == "silu":
        return v / (1.0 + np.exp(-v))
    if act == "sigmoid":
        return 1.0 / (1.0 + np.exp(-v))
    if act:
        raise ValueError(f"unknown activation {act!r}; one of {ACTIVATIONS} or none")
    return v


def gate_values(v: np.ndarray, gate: str, alpha: float, beta: float) -> np.ndarray:
    if gate == "hardsigmoid":
        return np.clip(alpha * v + beta, 0.0, 1.0)
    if gate == "sigmoid":
        return 1.0 / (1.0 + np.exp(-v))
    raise ValueError(f"unknown gate {gate!r}; one of {GATES}")


def reference(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray, act: str = "relu",
              gate: str = "hardsigmoid", alpha: float = 0.2, beta: float = 0.5, residual: bool = False,
              addend: np.ndarray | None = None) -> np.ndarray:
    """The block on plain x [N, C, H, W] (module docstring), computed in float64, returned as float32."""
    x64 = x.astype(np.float64)
    m = x64.mean(axis=(2, 3))
    z = _act(m @ w1.astype(np.float64).T + b1, act)
    s = gate_values(z @ w2.astype(np.float64).T + b2, gate, alpha, beta)
    y = x64 * s[:, :, None, None]
    if residual:
        y = y + x64
    if addend is not None:
        y = y + addend
    return y.astype(np.float32)


def unblock_1x1(wb: np.ndarray, block: int, blocked_input: bool) -> np.ndarray:
    """The [Cout, Cin] weights of ORT's blocked 1x1 filter ``wb`` (dims [Cout_p, Cin(_p), 1, 1], Cout
    padded to the block): memory [Cout_p/b, Cin_p/b, b_in, b_out] for a conv reading a blocked input,
    [Cout_p/b, Cin, b_out] for one reading a plain input."""
    cout, cin = wb.shape[:2]
    if blocked_input:
        w = wb.reshape(cout // block, cin // block, block, block)
        return np.ascontiguousarray(w.transpose(0, 3, 1, 2).reshape(cout, cin))
    wp = wb.reshape(cout // block, cin, block)
    return np.ascontiguousarray(wp.transpose(0, 2, 1).reshape(cout, cin))


def block_1x1(w: np.ndarray, block: int) -> np.ndarray:
    """ORT's blocked filter for a blocked input from plain [Cout, Cin] weights (both multiples of the
    block): the inverse of ``unblock_1x1(..., blocked_input=True)``, with dims [Cout, Cin, 1, 1]."""
    cout, cin = w.shape
    wb = w.reshape(cout // block, block, cin // block, block).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(wb).reshape(cout, cin, 1, 1)
