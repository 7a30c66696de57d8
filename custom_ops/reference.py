"""numpy reference math for the fused ops: the definition every kernel is checked against.

All functions take and return float32 arrays and compute in float32 (erf in float64, then rounded),
so they match ORT's unfused float32 ops to a few ulp.
"""

from __future__ import annotations

import json

import numpy as np

SQRT_2_OVER_PI = 0.7978845608028654


def erf(x: np.ndarray) -> np.ndarray:
    """erf with max abs error 1.2e-7 (Numerical Recipes erfc, Chebyshev fit), computed in float64."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    r = 1.0 - t * np.exp(poly)
    return np.where(np.isnan(x), np.nan, np.sign(x) * r).astype(np.float32)


def gelu(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + erf(x / sqrt 2))."""
    return (np.float32(0.5) * x * (np.float32(1) + erf(x / np.float32(np.sqrt(2))))).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    inner = np.float32(SQRT_2_OVER_PI) * (x + np.float32(0.044715) * x * x * x)
    return (np.float32(0.5) * x * (np.float32(1) + np.tanh(inner))).astype(np.float32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


def hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.clip(np.float32(alpha) * x + np.float32(beta), np.float32(0), np.float32(1)).astype(np.float32)


def relu(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, np.where(np.isnan(x), x, np.float32(0))).astype(x.dtype)


def clip(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.minimum(np.maximum(x, np.float32(lo)), np.float32(hi)).astype(np.float32)


def activation(y: np.ndarray, kind: str, alpha: float = 0.0, beta: float = 0.0) -> np.ndarray:
    """Apply an epilogue: '' | relu | gelu | gelu_tanh | clip(alpha=min, beta=max) |
    hardsigmoid(alpha, beta) | hardswish (x * hardsigmoid(x; alpha, beta)) | silu; '+' chains them."""
    for step in filter(None, kind.split("+")):
        if step == "relu":
            y = relu(y)
        elif step == "gelu":
            y = gelu(y)
        elif step == "gelu_tanh":
            y = gelu_tanh(y)
        elif step == "clip":
            y = clip(y, alpha, beta)
        elif step == "hardsigmoid":
            y = hard_sigmoid(y, alpha, beta)
        elif step == "hardswish":
            y = y * hard_sigmoid(y, alpha, beta)
        elif step == "silu":
            y = y * sigmoid(y)
        else:
            raise ValueError(f"unknown activation {step!r}")
    return y.astype(np.float32)


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray, strides, pads, dilations, group: int) -> np.ndarray:
    """NCHW convolution, ONNX semantics (pads = [top, left, bottom, right]), via im2col + matmul."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    sh, sw = strides
    dh, dw = dilations
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    out = np.empty((n, m, oh, ow), dtype=np.float32)
    mg = m // group
    for g in range(group):
        xg = xp[:, g * cg:(g + 1) * cg]
        cols = np.empty((n, cg, kh, kw, oh, ow), dtype=np.float32)
        for i in range(kh):
            for j in range(kw):
                rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
                cols[:, :, i, j] = xg[:, :, rows, j * dw: j * dw + sw * (ow - 1) + 1: sw]
        wg = w[g * mg:(g + 1) * mg].reshape(mg, -1)
        out[:, g * mg:(g + 1) * mg] = np.einsum("mk,nkp->nmp", wg, cols.reshape(n, cg * kh * kw, oh * ow),
                                                optimize=True).reshape(n, mg, oh, ow)
    return out + b.reshape(1, m, 1, 1).astype(np.float32)


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v != ""]


def conv_act(x, w, b, *, strides: str, pads: str, dilations: str, group: int, activation_kind: str,
             alpha: float, beta: float, residual=None) -> np.ndarray:
    """act(conv(x, w) + b [+ residual])."""
    y = conv2d(x, w, b, ints(strides), ints(pads), ints(dilations), int(group))
    if residual is not None:
        y = y + residual
    return activation(y, activation_kind, alpha, beta)


def gemm_act(x, w, b, *, activation_kind: str) -> np.ndarray:
    """act(x @ w + b) for x of any rank >= 1 and w of shape [K, N], b of shape [N]."""
    return activation(np.matmul(x, w) + b, activation_kind)


def add_relu(a, b) -> np.ndarray:
    """relu(a + b) with numpy broadcasting."""
    return relu(a + b)


def hardswish(x, *, add: float, lo: float, hi: float, div: float) -> np.ndarray:
    """x * (clip(x + add, lo, hi) / div): Add->Clip->Div->Mul written as one op (HardSwish: 3, 0, 6, 6)."""
    return (x * (clip(x + np.float32(add), lo, hi) / np.float32(div))).astype(np.float32)


def silu(x) -> np.ndarray:
    """x * sigmoid(x)."""
    return (x * sigmoid(x)).astype(np.float32)


UNARY = {
    "Relu": relu,
    "Sigmoid": sigmoid,
    "Tanh": np.tanh,
    "Exp": np.exp,
    "Log": np.log,
    "Abs": np.abs,
    "Neg": np.negative,
    "Sqrt": np.sqrt,
    "Reciprocal": np.reciprocal,
    "Erf": erf,
    "Floor": np.floor,
    "Ceil": np.ceil,
    "Softplus": lambda x: np.logaddexp(np.float32(0), x),
}
def c_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Power with C's ``pow`` semantics (ORT's), which differ from numpy's for a base of -inf:
    pow(-inf, y) is +inf for y > 0 and +0 for y < 0 unless y is an odd integer (then -inf / -0)."""
    out = np.power(a, b)
    b = np.broadcast_to(b, out.shape)
    a = np.broadcast_to(a, out.shape)
    odd = (np.mod(b, 2) == 1) | (np.mod(b, 2) == -1)
    fix = np.isneginf(a) & ~odd & ~np.isnan(b)
    if fix.any():
        out = np.where(fix & (b > 0), np.float32(np.inf), np.where(fix & (b < 0), np.float32(0), out))
    return out


BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": c_pow,
          "Max": np.maximum, "Min": np.minimum}
PARAM_UNARY = ("LeakyRelu", "Clip", "HardSigmoid")  # unary ops with float parameters (eltwise_chain steps)
# The one table of elementwise ops an eltwise_chain may hold; its order is the native chain's op codes.
ELTWISE_OPS: tuple[str, ...] = (*UNARY, *PARAM_UNARY, *BINARY)


def eltwise_chain(x, *operands, program: str) -> np.ndarray:
    """Run a JSON program of steps on x, in order. A step is {"op": name} (unary), {"op": name,
    "args": ["x", "c0"]} (binary; "x" is the running value, "cK" the K-th operand), or a unary op
    with parameters: LeakyRelu {"alpha"}, Clip {"min", "max"}, HardSigmoid {"alpha", "beta"}."""
    y = x
    with np.errstate(all="ignore"):
        for step in json.loads(program):
            op = step["op"]
            if "args" in step:
                a, b = (y if s == "x" else operands[int(s[1:])] for s in step["args"])
                y = BINARY[op](a, b)
            elif op == "LeakyRelu":
                y = np.where(y >= 0, y, y * np.float32(step["alpha"]))
            elif op == "Clip":
                y = clip(y, step["min"], step["max"])
            elif op == "HardSigmoid":
                y = hard_sigmoid(y, step["alpha"], step["beta"])
            else:
                y = UNARY[op](y)
            y = np.asarray(y, dtype=np.float32)
    return y
