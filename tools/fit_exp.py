"""Fit the polynomial of ``custom_ops/vecmath.py``'s exp (``_E2`` .. ``_E6``).

e**r ~ 1 + r + r**2 (c2 + c3 r + ... + c6 r**4) on the reduced range |r| <= ln2/2, minimising the max
relative error by Lawson's iteratively reweighted least squares over a dense grid; the coefficients
are rounded to float32 and the max relative error of the rounded polynomial (in float64) is printed.
Run: ``python tools/fit_exp.py``.
"""

from __future__ import annotations

import numpy as np


def fit(degree: int = 6, iterations: int = 300) -> tuple[np.ndarray, float]:
    h = np.log(2.0) / 2 * 1.0001
    r = np.linspace(-h, h, 40001)
    r = r[r != 0]
    target = (np.exp(r) - 1 - r) / r**2          # fit c2 + c3 r + ... to this
    scale = r**2 / np.exp(r)                     # an error e in it is a relative error e * scale of e**r
    a = np.vander(r, degree - 1, increasing=True)
    w = np.ones_like(r)
    c = np.zeros(degree - 1)
    for _ in range(iterations):
        sw = np.sqrt(w) * scale
        c = np.linalg.lstsq(a * sw[:, None], target * sw, rcond=None)[0]
        err = np.abs(a @ c - target) * scale
        w = w * err
        w /= w.sum()
    c32 = c.astype(np.float32).astype(np.float64)
    rel = np.abs((1 + r + r**2 * (a @ c32)) / np.exp(r) - 1).max()
    return c32.astype(np.float32), float(rel)


if __name__ == "__main__":
    coeffs, err = fit()
    print("c2..c6:", [repr(float(v)) for v in coeffs], f"max relative error {err:.3g} ({np.log2(err):.1f} bits)")
