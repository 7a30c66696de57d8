"""numpy models of what the AMX bf16 GEMM (custom_ops/native/ops/gemm_bf16.py, custom_ops/kernels/amx.py)
computes, written from the instruction set's definition, independent of the numba code: bf16
rounding, the packed-W and X-row layouts, the tile configuration bytes, and ``tdpbf16ps`` over a whole
GEMM (see custom_ops/kernels/amx_emulated.py for the semantics)."""

from __future__ import annotations

import math

import numpy as np

K_STEP = 32        # K per tdpbf16ps
COL_TILE = 16      # columns per B tile
BLOCK_COLS = 32    # N is padded to this
FLT_MIN = np.float32(2.0**-126)


def round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def bf16_bits(a) -> np.ndarray:
    """float32 -> bf16 bits (uint16): round to nearest even on the bits, NaN kept NaN with the quiet bit."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16).reshape(np.shape(a))


def bf16(a) -> np.ndarray:
    """float32 -> nearest bf16 (ties to even), as float32."""
    return (bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def daz(bits: np.ndarray) -> np.ndarray:
    """The float32 values tdpbf16ps reads for bf16 bits: denormals as zero of their sign."""
    bits = bits.astype(np.uint32)
    bits = np.where(bits & 0x7F80 == 0, bits & 0x8000, bits)
    return (bits << 16).view(np.float32)


def ftz(v: np.ndarray) -> np.ndarray:
    """Subnormal float32 results as zero of their sign."""
    return np.where((v != 0) & (np.abs(v) < FLT_MIN), v * np.float32(0), v).astype(np.float32)


def packed_weights(w: np.ndarray) -> np.ndarray:
    """W [K, N] in the pair-interleaved layout (Kp x Np uint16): per column tile t of 16 columns,
    Kp/2 rows p of 16 pairs (W[2p, c], W[2p+1, c]); zero beyond K and N."""
    k, n = w.shape
    kp, np_ = round_up(k, K_STEP), round_up(n, BLOCK_COLS)
    padded = np.zeros((kp, np_), np.uint16)
    padded[:k, :n] = bf16_bits(w)
    return padded.reshape(kp // 2, 2, np_ // COL_TILE, COL_TILE).transpose(2, 0, 3, 1).reshape(-1)


def x_rows(x: np.ndarray, lda: int, fill: int = 0) -> np.ndarray:
    """X [M, K] as the converted rows: M x lda uint16, bf16 up to K, zero to Kp, ``fill`` (untouched
    memory) from Kp to lda."""
    m, k = x.shape
    kp = round_up(k, K_STEP)
    out = np.full((m, lda), fill, np.uint16)
    out[:, :k] = bf16_bits(x)
    out[:, k:kp] = 0
    return out


def tile_config(rows0: int, rows1: int) -> np.ndarray:
    """The 64-byte palette-1 configuration of a block: tmm0/1/4 rows0 rows, tmm2/3/5 rows1 (0: unused),
    tmm6/7 16 rows; every used tile 64 bytes a row (colsb words at byte 16 + 2t, rows at 48 + t)."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    for t, r in enumerate((rows0, rows0, rows1, rows1, rows0, rows1, 16, 16)):
        if r:
            cfg[16 + 2 * t] = 64
            cfg[48 + t] = r
    return cfg


def tdpbf16ps_gemm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """X @ W as the tile kernel computes it: X and W rounded to bf16, K zero-padded to a multiple of 32,
    one tdpbf16ps per 32 of K in order (even and odd partial sums over the 16 pairs, then C += even +
    odd), DAZ on the inputs, FTZ on every result. float32 [M, N]."""
    m, k = x.shape
    kp = round_up(k, K_STEP)
    a = np.zeros((m, kp), np.float32)
    b = np.zeros((kp, w.shape[1]), np.float32)
    a[:, :k] = daz(bf16_bits(x))
    b[:k] = daz(bf16_bits(w))
    c = np.zeros((m, w.shape[1]), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(0, kp, K_STEP):
            even = np.zeros_like(c)
            odd = np.zeros_like(c)
            for p in range(s, s + K_STEP, 2):
                even = ftz(even + a[:, p, None] * b[None, p])
                odd = ftz(odd + a[:, p + 1, None] * b[None, p + 1])
            c = ftz(c + ftz(even + odd))
    return c


_erf64 = np.vectorize(math.erf, otypes=[np.float64])  # the C library's erf, to float64 accuracy (no scipy needed)


def act64(y: np.ndarray, act: str) -> np.ndarray:
    """The epilogue ``act`` ('+'-joined relu, gelu, gelu_tanh, silu) in float64."""
    for step in filter(None, act.split("+")):
        if step == "relu":
            y = np.maximum(y, 0)
        elif step == "gelu":
            y = 0.5 * y * (1 + _erf64(y / np.sqrt(2)))
        elif step == "gelu_tanh":
            y = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
        elif step == "silu":
            y = y / (1 + np.exp(-y))
        else:
            raise ValueError(f"unknown epilogue step {step!r}")
    return y
