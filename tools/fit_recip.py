"""Fit the initial reciprocal guess of ``custom_ops/vecmath.py`` (``_RQ2``, ``_RQ1``, ``_RQ0``).

Minimax (in relative error) polynomial r(d) ~ 1/d on an interval, by Lawson's iteratively reweighted
least squares over a dense grid; the coefficients are rounded to float32 and the max relative error
|r(d) d - 1| of the rounded coefficients is printed. Run: ``python tools/fit_recip.py``.
"""

from __future__ import annotations

import numpy as np


def fit(lo: float, hi: float, degree: int, iterations: int = 200) -> tuple[np.ndarray, float]:
    d = np.linspace(lo, hi, 20001)
    w = np.ones_like(d)
    c = np.zeros(degree + 1)
    for _ in range(iterations):
        a = np.vander(d, degree + 1) * (d * np.sqrt(w))[:, None]
        c = np.linalg.lstsq(a, np.sqrt(w), rcond=None)[0]
        err = np.abs(np.polyval(c, d) * d - 1)
        w = w * err
        w /= w.sum()
    c32 = c.astype(np.float32).astype(np.float64)
    return c32.astype(np.float32), float(np.abs(np.polyval(c32, d) * d - 1).max())


if __name__ == "__main__":
    coeffs, err = fit(1.0, 2.0, 2)
    print(f"1/d on [1, 2], highest power first: {[repr(float(v)) for v in coeffs]}; max relative error {err:.4g}")
