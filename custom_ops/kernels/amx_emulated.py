"""The AMX micro-kernel interface of ``kernels/amx.py`` on a plain-numba model of the tile instructions:
``OrtfuseGemmActBf16Emulated`` runs the op's driver on it, so bf16 packing, X conversion, block loops,
tails and epilogue are tested on any x86-64 CPU (docs/ARCHITECTURE.md §5). Scalar and slow; never
selected by the registry.

The model follows the Intel SDM's pseudocode of ``tdpbf16ps tmm_c, tmm_a, tmm_b``: for each row m of
C (as many as configured) and each of its 16 columns n, two float32 partial sums start at zero; for
each of the 16 bf16 pairs k of A's row m in turn, the even sum takes A[m].bf16[2k] * B[k].bf16[2n]
and the odd sum A[m].bf16[2k+1] * B[k].bf16[2n+1] (each an FMA); then C[m, n] += even + odd. Rounding
is to nearest even, bf16 denormal inputs read as zero of their sign (DAZ), denormal results become
zero of their sign (FTZ), MXCSR plays no part. A product of two bf16 is exact in float32 unless it
falls below float32's normal range, so each FMA here is the float32 sum of the float32 product; the
model differs from the hardware only when a product is below 2^-126 while the partial sum is not zero
(then the product is rounded once more). Tile loads and stores are modelled by their addresses:
A rows ``a_stride`` bytes apart, B rows 64 bytes apart, C rows ``c_stride`` bytes apart, only the
configured rows.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from ortfuse.custom_ops.intrinsics import int_to_voidptr, stack_bytes
from ortfuse.custom_ops.kernels.amx import BLOCK_COLS, BLOCK_ROWS, K_STEP, TILE_BYTES, TILE_ROWS, write_config
from ortfuse.custom_ops.vecmath import i32_as_f32

FLT_MIN = np.float32(2.0**-126)   # the smallest normal float32
PAIRS = TILE_BYTES // 4           # bf16 pairs per tile row (16)
C_BYTES = 4 * BLOCK_ROWS * BLOCK_COLS


@njit(nogil=True, cache=True)
def ftz(v):
    """float32 v, or a zero of v's sign when v is subnormal (FTZ)."""
    if v != 0 and abs(v) < FLT_MIN:
        return v * np.float32(0)
    return v


@njit(nogil=True, cache=True)
def bf16_value(bits):
    """The float32 that tdpbf16ps reads for the bf16 ``bits`` (uint16): denormals as zero (DAZ)."""
    b = np.uint32(bits)
    if (b & np.uint32(0x7F80)) == 0:
        b &= np.uint32(0x8000)
    return i32_as_f32(np.int32(b << np.uint32(16)))


@njit(nogil=True, cache=True)
def tdpbf16ps(c, c_col, rows, a_addr, a_stride, b_addr):
    """One ``tdpbf16ps``: C[m, c_col:c_col + 16] += A[m] . B for m < rows, where c is the block's
    float32 accumulators (32 columns per row), A's row m is 64 bytes at a_addr + m a_stride and B is
    16 rows of 64 bytes at b_addr."""
    b = carray(int_to_voidptr(b_addr), (PAIRS * 2 * PAIRS,), np.uint16)
    for m in range(rows):
        a = carray(int_to_voidptr(a_addr + m * a_stride), (2 * PAIRS,), np.uint16)
        for n in range(PAIRS):
            even = np.float32(0)
            odd = np.float32(0)
            for k in range(PAIRS):
                even = ftz(even + bf16_value(a[2 * k]) * bf16_value(b[k * 2 * PAIRS + 2 * n]))
                odd = ftz(odd + bf16_value(a[2 * k + 1]) * bf16_value(b[k * 2 * PAIRS + 2 * n + 1]))
            i = m * BLOCK_COLS + c_col + n
            c[i] = ftz(c[i] + ftz(even + odd))


@njit(nogil=True, cache=True)
def request_tiles():
    """Micro-kernel interface: the model needs no permission."""
    return 0


@njit(nogil=True, cache=True)
def configure_tiles(cfg_addr, rows):
    """Micro-kernel interface: the configuration bytes the AMX kernel would load (never loaded)."""
    rows0 = min(TILE_ROWS, rows)
    write_config(cfg_addr, rows0, rows - rows0)


@njit(nogil=True, cache=True)
def tile_block(a_addr, a_stride, kp, rows, b0_addr, b1_addr, c_addr, c_stride):
    """Micro-kernel interface: ``amx.tile_block`` on the model (same loads, products and stores)."""
    c = carray(int_to_voidptr(stack_bytes(C_BYTES)), (BLOCK_ROWS * BLOCK_COLS,), np.float32)  # tmm0-3, zeroed
    rows0 = min(TILE_ROWS, rows)
    rows1 = rows - rows0
    a1_addr = a_addr + TILE_ROWS * a_stride
    c1 = c[TILE_ROWS * BLOCK_COLS:]
    for s in range(kp // K_STEP):
        tdpbf16ps(c, 0, rows0, a_addr + TILE_BYTES * s, a_stride, b0_addr + 1024 * s)
        tdpbf16ps(c, TILE_ROWS, rows0, a_addr + TILE_BYTES * s, a_stride, b1_addr + 1024 * s)
        if rows1 > 0:
            tdpbf16ps(c1, 0, rows1, a1_addr + TILE_BYTES * s, a_stride, b0_addr + 1024 * s)
            tdpbf16ps(c1, TILE_ROWS, rows1, a1_addr + TILE_BYTES * s, a_stride, b1_addr + 1024 * s)
    for m in range(rows):
        dst = carray(int_to_voidptr(c_addr + m * c_stride), (BLOCK_COLS,), np.float32)
        for j in range(BLOCK_COLS):
            dst[j] = c[m * BLOCK_COLS + j]


@njit(nogil=True, cache=True)
def release_tiles():
    """Micro-kernel interface: nothing to release."""
