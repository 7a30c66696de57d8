"""The plain (tile-free) numba code of the AMX bf16 GEMM against numpy models (tests/amx_reference.py),
on any CPU: bf16 conversion, the converted X rows, weight packing into the tile layout, the tile
configuration bytes, the kernel's packed-weights block, the N-tail copy and the bias/activation rows.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import amx_reference as ref

numba = pytest.importorskip("numba")

from ortfuse.custom_ops.kernels import amx, amx_emulated  # noqa: E402
from ortfuse.custom_ops.native.ops import gemm_bf16  # noqa: E402


@numba.njit
def _bf16_all(bits, out):
    for i in range(bits.shape[0]):
        out[i] = amx.bf16_bits(bits[i])


@numba.njit
def _free(addr):
    gemm_bf16.c_free(addr)


@pytest.fixture(scope="module", autouse=True)
def _numba_configured():
    """The package's numba set-up (cache location) before its kernels compile here."""
    from ortfuse.custom_ops.numba_setup import configure_numba

    configure_numba()


def _addr(a: np.ndarray) -> int:
    return a.ctypes.data


def _words(addr: int, n: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_int64 * n).from_address(addr)).copy()


def _u16(addr: int, n: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint16 * n).from_address(addr)).copy()


# --------------------------------------------------------------------------------------------------
# bf16 conversion
# --------------------------------------------------------------------------------------------------


def _bits_sweep() -> np.ndarray:
    """Every upper half (sign, exponent, 7 mantissa bits) with lower halves at and around the rounding
    boundaries (0, 1, half - 1, half, half + 1, all ones) and a random one: 458,752 float32 patterns."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    rnd = np.random.default_rng(0).integers(0, 1 << 16, hi.size, dtype=np.uint32)
    return np.concatenate([(hi[:, None] | lows[None, :]).ravel(), hi | rnd])


def test_bf16_bits_matches_the_numpy_model_on_a_sweep_of_all_exponents():
    bits = _bits_sweep()
    out = np.empty(bits.size, np.uint16)
    _bf16_all(bits, out)
    assert np.array_equal(out, ref.bf16_bits(bits.view(np.float32)))


def test_bf16_bits_is_the_nearest_bf16_ties_to_even():
    """Independent of the bit formula: the bf16 chosen is at least as near as both neighbours in
    float64, on a tie the one with an even last bit; NaN stays NaN (quiet, same sign); beyond the
    largest bf16 plus half an ulp the result is Inf of the sign."""
    bits = _bits_sweep()
    out = np.empty(bits.size, np.uint16)
    _bf16_all(bits, out)
    with np.errstate(invalid="ignore"):  # signalling NaNs
        x = bits.view(np.float32).astype(np.float64)
    nan = np.isnan(x)
    assert np.all(out[nan] & 0x7FC0 == 0x7FC0) and np.array_equal(out[nan] >> 15, (bits[nan] >> 31).astype(np.uint16))
    fin = ~nan & np.isfinite(x)
    o = out[fin].astype(np.int64)
    val = (o.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    inf = np.isinf(val)
    biggest = 0x7F7F  # largest finite bf16, (2 - 2^-7) 2^127; half an ulp above it is a tie, to Inf
    limit = 2.0**128 - 2.0**119
    assert np.all(np.abs(x[fin][inf]) >= limit) and np.all(np.abs(x[fin][~inf]) < limit)
    xs, o, val = x[fin][~inf], o[~inf], val[~inf]
    assert np.all(np.sign(val) * np.sign(xs) >= 0)
    for step in (-1, 1):  # neighbours by magnitude (same sign); clipped at zero and at the largest
        nb = np.clip((o & 0x7FFF) + step, 0, biggest) | (o & 0x8000)
        nval = (nb.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        d, dn = np.abs(xs - val), np.abs(xs - nval)
        assert np.all(d <= dn)
        tie = (d == dn) & (nb != o)
        assert np.all(o[tie] & 1 == 0)


def test_bf16_bits_special_values():
    cases = [(0.0, 0x0000), (-0.0, 0x8000), (1.0, 0x3F80), (-2.0, 0xC000), (np.inf, 0x7F80), (-np.inf, 0xFF80),
             (3.4e38, 0x7F80),              # above the largest bf16 + half an ulp: Inf
             (1.00390625, 0x3F80),          # 1 + 2^-8: a tie, to the even 1.0
             (1.01171875, 0x3F82),          # 1 + 3 * 2^-8: a tie, to the even 1 + 2^-6
             (1e-40, 0x0001),               # a float32 subnormal rounds to a bf16 subnormal
             (1e-45, 0x0000)]               # the smallest float32 subnormal rounds to zero
    x = np.array([c[0] for c in cases], np.float32)
    out = np.empty(x.size, np.uint16)
    _bf16_all(x.view(np.uint32), out)
    assert [hex(v) for v in out] == [hex(c[1]) for c in cases]
    nan = np.array([0x7FC00000, 0xFF800001, 0x7F800001], np.uint32)  # quiet, signalling (sign set), signalling
    _bf16_all(nan, out[:3])
    assert [hex(v) for v in out[:3]] == ["0x7fc0", "0xffc0", "0x7fc0"]


# --------------------------------------------------------------------------------------------------
# X rows, weight packing, tile configuration
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m, k, r0, rows", [(1, 1, 0, 1), (5, 31, 1, 3), (70, 32, 64, 6), (3, 33, 0, 3),
                                             (4, 100, 2, 2), (2, 4096, 0, 2)])
def test_convert_rows_writes_bf16_rows_zero_padded_to_kp(m, k, r0, rows):
    x = np.random.default_rng(k).standard_normal((m, k)).astype(np.float32)
    flat = x.reshape(-1)
    flat[::7] = np.resize(np.array([np.nan, np.inf, -np.inf, 1e-40, -0.0], np.float32), flat[::7].size)
    kp = amx.round_up(k, amx.K_STEP)
    lda = amx.a_row_elems(kp)
    dst = np.full((rows + 1, lda), 0xAAAA, np.uint16)  # one row more: must stay untouched
    amx.convert_rows(_addr(x), k, r0, rows, kp, lda, _addr(dst))
    assert np.array_equal(dst[:rows], ref.x_rows(x[r0:r0 + rows], lda, fill=0xAAAA))
    assert np.all(dst[rows] == 0xAAAA)


def test_converted_row_stride_is_kp_plus_one_cache_line():
    """Rows 64-byte aligned, one cache line beyond Kp: where Kp is a multiple of 2048 (K = 2048, 4096,
    ...) the stride is then no multiple of 4 KiB, so a tile's 16 rows do not share one L1 set."""
    for kp in range(32, 1 << 16, 32):
        lda = amx.a_row_elems(kp)
        assert lda == kp + 32 and (2 * lda) % 64 == 0, kp
        if kp % 2048 == 0:
            assert (2 * lda) % 4096 != 0, kp


@pytest.mark.parametrize("k, n", [(1, 1), (31, 15), (32, 16), (32, 32), (33, 17), (64, 33), (70, 100), (5, 48),
                                  (257, 300)])
def test_pack_weights_gives_the_pair_interleaved_tile_layout(k, n):
    w = np.random.default_rng(n).standard_normal((k, n)).astype(np.float32)
    kp, np_ = amx.round_up(k, amx.K_STEP), amx.round_up(n, amx.BLOCK_COLS)
    assert amx.packed_bytes(k, n) == 2 * kp * np_
    dst = np.full(kp * np_ + 32, 0xAAAA, np.uint16)
    amx.pack_weights(_addr(w), k, n, kp, np_, _addr(dst))
    assert np.array_equal(dst[:kp * np_], ref.packed_weights(w))
    assert np.all(dst[kp * np_:] == 0xAAAA)
    # the layout in words: column c of row r sits in column tile c // 16, pair row r // 2, slot 2 (c % 16) + r % 2
    tiles = dst[:kp * np_].reshape(np_ // 16, kp // 2, 32)
    r, c = k - 1, n - 1
    assert tiles[c // 16, r // 2, 2 * (c % 16) + r % 2] == ref.bf16_bits(w[r, c])


@pytest.mark.parametrize("rows", range(1, 33))
def test_tile_configuration_bytes(rows):
    """Palette 1; tmm0/1/4 (first row tile) and tmm2/3/5 (second) get the block's rows, B tiles 16;
    unused tiles all zero. The emulated configure writes what the AMX one loads."""
    rows0 = min(16, rows)
    cfg = np.full(amx.CFG_BYTES, 0xEE, np.uint8)
    amx.write_config(_addr(cfg), rows0, rows - rows0)
    assert np.array_equal(cfg, ref.tile_config(rows0, rows - rows0))
    cfg[:] = 0xEE
    amx_emulated.configure_tiles(_addr(cfg), rows)
    assert np.array_equal(cfg, ref.tile_config(rows0, rows - rows0))


# --------------------------------------------------------------------------------------------------
# the kernel's packed-weights block
# --------------------------------------------------------------------------------------------------


def test_kernel_pack_publishes_once_and_packs_other_weights_for_one_call():
    slot = np.zeros(64, np.int64)  # a kernel-state slot: only the owned-buffer word is used
    k, n = 70, 45
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    raw, temporary = gemm_bf16.kernel_pack(_addr(slot), _addr(w), k, n)
    assert raw != 0 and not temporary and slot[gemm_bf16.S_OWNED] == raw
    head = _words(raw, 7)
    kp, np_ = amx.round_up(k, 32), amx.round_up(n, 32)
    assert list(head[:6]) == [gemm_bf16.PACK_MAGIC, _addr(w), k, n, kp, np_]
    data = int(head[gemm_bf16.PK_DATA])
    assert data % 64 == 0 and raw + gemm_bf16.PACK_HEADER <= data < raw + gemm_bf16.PACK_HEADER + 64
    assert np.array_equal(_u16(data, kp * np_), ref.packed_weights(w))
    assert gemm_bf16.kernel_pack(_addr(slot), _addr(w), k, n) == (raw, False)  # the published one again
    other = w[:, :40].copy()
    raw2, temporary = gemm_bf16.kernel_pack(_addr(slot), _addr(other), k, 40)
    assert temporary and raw2 not in (0, raw) and slot[gemm_bf16.S_OWNED] == raw
    data2 = int(_words(raw2, 7)[gemm_bf16.PK_DATA])
    assert np.array_equal(_u16(data2, kp * 64), ref.packed_weights(other))
    _free(raw2)
    _free(raw)


# --------------------------------------------------------------------------------------------------
# N tail and epilogue rows
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows, width", [(1, 1), (16, 15), (17, 31), (32, 7)])
def test_copy_tail_copies_the_valid_columns_of_the_scratch_block(rows, width):
    m, n, r0 = 40, 64 + width, 5
    src = np.random.default_rng(rows).standard_normal(32 * 32).astype(np.float32)
    y = np.full((m, n), -7, np.float32)
    gemm_bf16.copy_tail(_addr(src), _addr(y), n, r0, rows, 64, width)
    want = np.full((m, n), -7, np.float32)
    want[r0:r0 + rows, 64:] = src.reshape(32, 32)[:rows, :width]
    assert np.array_equal(y, want)


def _codes(act: str) -> np.ndarray:
    choices = gemm_bf16.OP.attrs[0].choices
    codes = np.zeros(gemm_bf16.GEMM_MAX_STEPS, np.int64)
    steps = [choices.index(s) for s in filter(None, act.split("+"))]
    codes[:len(steps)] = steps
    return codes


@pytest.mark.parametrize("act", ["", "relu", "gelu", "gelu_tanh", "silu", "relu+gelu"])
def test_bias_act_rows_on_a_block_of_rows_and_columns(act):
    """y[r, c0:c1] = act(y + b) for the block's rows and columns only; the bias sum is float32, relu
    exact, the other epilogues within a few ulp (vecmath) of float64."""
    m, n, r0, rows, c0, c1 = 9, 70, 2, 5, 32, 70
    y0 = (np.random.default_rng(0).standard_normal((m, n)) * 3).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    y = y0.copy()
    gemm_bf16.bias_act_rows(y.ravel(), b, r0, rows, n, c0, c1, _codes(act), len(list(filter(None, act.split("+")))))
    inside = np.zeros((m, n), bool)
    inside[r0:r0 + rows, c0:c1] = True
    assert np.array_equal(y[~inside], y0[~inside])
    pre = (y0 + b)[inside]
    if act in ("", "relu"):
        assert np.array_equal(y[inside], np.maximum(pre, 0) if act else pre)
    else:
        want = ref.act64(pre.astype(np.float64), act)
        assert np.all(np.abs(y[inside] - want) <= 2.0**-20 * np.abs(want) + 1e-6)
