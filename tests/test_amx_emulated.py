"""The AMX bf16 GEMM's driver on any CPU: the plain-numba model of the tile instructions
(custom_ops/kernels/amx_emulated.py) against the numpy model of ``tdpbf16ps`` (tests/amx_reference.py),
then the whole op, ``OrtfuseGemmActBf16Emulated`` (the driver of ``FusedGemmActBf16`` with the tile
instructions replaced by the model), bit for bit against the numpy model through ORT: packing, X
conversion, block loops, M/N/K tails, threads and the epilogue. tests/test_amx.py runs the op's
numerics tests on both ops; the AMX one needs the hardware."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import amx_reference as ref

pytest.importorskip("numba")

from ortfuse.custom_ops import registration  # noqa: E402
from ortfuse.custom_ops.kernels import amx_emulated as emu  # noqa: E402
from ortfuse.custom_ops.native.ops import gemm_bf16  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _numba_configured():
    """The package's numba set-up (cache location) before its kernels compile here."""
    from ortfuse.custom_ops.numba_setup import configure_numba

    configure_numba()


def _addr(a: np.ndarray) -> int:
    return a.ctypes.data


# --------------------------------------------------------------------------------------------------
# the instruction model
# --------------------------------------------------------------------------------------------------


def _block(x, w, rows_extra=0, c_cols=32):
    """emu.tile_block on X [rows, K] and W [K, 32] laid out as the driver lays them out; C written into
    a [rows + rows_extra, c_cols] buffer of sentinels."""
    rows, k = x.shape
    kp = ref.round_up(k, ref.K_STEP)
    lda = kp + 32
    a = ref.x_rows(x, lda, fill=0xFFFF)  # NaN bf16 beyond Kp: the model must never read it
    b = ref.packed_weights(w)
    c = np.full((rows + rows_extra, c_cols), -3, np.float32)
    emu.tile_block(_addr(a), 2 * lda, kp, rows, _addr(b), _addr(b) + kp * 32, _addr(c), 4 * c_cols)
    return c


@pytest.mark.parametrize("rows", [1, 2, 15, 16, 17, 31, 32])
@pytest.mark.parametrize("k", [1, 32, 33, 100])
def test_model_block_matches_numpy_tdpbf16ps(rows, k):
    rng = np.random.default_rng(rows * 1000 + k)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, 32)).astype(np.float32)
    c = _block(x, w, rows_extra=2, c_cols=40)
    assert np.array_equal(c[:rows, :32], ref.tdpbf16ps_gemm(x, w))
    assert np.all(c[:rows, 32:] == -3) and np.all(c[rows:] == -3)  # only the configured rows, 32 columns


def test_model_sums_even_and_odd_pairs_apart_as_the_sdm_defines():
    """Products 2^24, 1, 1, 1 (K order): summed in K order in float32 they give 2^24 (each + 1 is a
    tie, to even); tdpbf16ps sums the even (2^24 + 1 -> 2^24) and odd (1 + 1) elements apart, then
    adds: 2^24 + 2."""
    x = np.array([[2.0**24, 1, 1, 1]], np.float32)
    w = np.zeros((4, 32), np.float32)
    w[:, 0] = 1
    assert np.float32(np.float32(np.float32(2.0**24) + 1) + 1) + 1 == 2.0**24
    assert _block(x, w)[0, 0] == 2.0**24 + 2 == ref.tdpbf16ps_gemm(x, w)[0, 0]


def test_model_reads_denormals_as_zero_and_flushes_denormal_results():
    x = np.zeros((2, 32), np.float32)
    w = np.zeros((32, 32), np.float32)
    x[0, 0] = 1e-39              # its bf16 is a denormal: read as zero
    w[0, 0] = 2.0**100
    x[1, 0] = 2.0**-70           # 2^-70 * 2^-60 = 2^-130: a denormal result, flushed (-0 here)
    w[0, 1] = -(2.0**-60)
    x[1, 2] = 2.0**-100          # 2^-100 * 2^-20 = 2^-120: normal, kept
    w[2, 1] = 2.0**-20
    c = _block(x, w)
    assert c[0, 0] == 0 and not np.signbit(c[0, 0])
    assert c[1, 1] == 2.0**-120
    assert np.array_equal(c, ref.tdpbf16ps_gemm(x, w))
    alone = x[1:].copy()
    alone[0, 2] = 0
    assert _block(alone, w)[0, 1] == 0 and np.float32(2.0**-70) * np.float32(-(2.0**-60)) != 0  # flushed, not rounded


def test_model_propagates_nan_and_inf():
    x = np.ones((3, 40), np.float32)
    w = np.ones((40, 32), np.float32)
    x[0, 3] = np.nan
    x[1, 5] = np.inf
    w[7, 4] = -np.inf
    c = _block(x, w)
    want = ref.tdpbf16ps_gemm(x, w)
    assert np.array_equal(np.isnan(c), np.isnan(want)) and np.isnan(c[0]).all()
    assert np.array_equal(c[np.isfinite(want)], want[np.isfinite(want)])
    assert np.isposinf(c[1, 0]) and np.isnan(c[1, 4]) and np.isneginf(c[2, 4])


# --------------------------------------------------------------------------------------------------
# the op through ORT, bit for bit
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emulated_op():
    if registration.native_unavailable_reason():
        pytest.skip(f"the native path is unavailable here: {registration.native_unavailable_reason()}")
    registration.add_native_op(gemm_bf16.EMULATED_OP)
    return gemm_bf16.EMULATED_OP_NAME


def _session(op, w, b, act, threads, x_dims):
    node = helper.make_node(op, ["X", "W", "B"], ["Y"], domain="ai.onnx.contrib", activation=act)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_dims)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.contrib", 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    assert registration.register_native(so, [op]), registration.native_unavailable_reason([op])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


# M around the row pair (32) and super-block (128) edges, N around the column tiles (16) and pairs
# (32, the tail through the scratch block), K around the 32 of one tdpbf16ps; few and many column groups
SHAPES = [(1, 1, 1), (2, 31, 15), (16, 32, 16), (17, 33, 17), (31, 64, 31), (32, 65, 32), (33, 96, 33),
          (129, 40, 70), (300, 17, 64), (5, 300, 1000), (257, 100, 97)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, k, n", SHAPES)
def test_op_is_bit_exact_to_the_numpy_model(emulated_op, m, k, n, threads):
    rng = np.random.default_rng(m + k + n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    pre = ref.tdpbf16ps_gemm(x, w) + b
    assert np.array_equal(_session(emulated_op, w, b, "", threads, ["m", k]).run(None, {"X": x})[0], pre)
    assert np.array_equal(_session(emulated_op, w, b, "relu", threads, ["m", k]).run(None, {"X": x})[0],
                          np.maximum(pre, 0))


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "silu", "relu+gelu"])
def test_op_epilogues_on_the_exact_products(emulated_op, act):
    """The products bit for bit, the epilogue within its own few ulp (vecmath) of float64."""
    rng = np.random.default_rng(7)
    k, n = 70, 45
    w, b = rng.standard_normal((k, n)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((2, 20, k)).astype(np.float32)
    y = _session(emulated_op, w, b, act, 2, ["a", "m", k]).run(None, {"X": x})[0]
    want = ref.act64((ref.tdpbf16ps_gemm(x.reshape(-1, k), w) + b).astype(np.float64), act).reshape(2, 20, n)
    assert np.all(np.abs(y - want) <= 2.0**-20 * np.abs(want) + 1e-6)


def test_op_special_values_and_denormal_inputs(emulated_op):
    rng = np.random.default_rng(9)
    k, n = 40, 33
    w, b = rng.standard_normal((k, n)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    w[3, 5] = np.inf
    x = rng.standard_normal((6, k)).astype(np.float32)
    x[0, 1], x[1, 2], x[2, 3], x[3] = np.nan, -np.inf, 0, 1e-39  # row 3: bf16 denormals, read as zero
    y = _session(emulated_op, w, b, "", 1, ["m", k]).run(None, {"X": x})[0]
    want = ref.tdpbf16ps_gemm(x, w) + b
    assert np.array_equal(np.isnan(y), np.isnan(want)) and np.isnan(y[0]).all()
    assert np.array_equal(y[~np.isnan(want)], want[~np.isnan(want)])
    others = np.arange(n) != 5
    assert np.array_equal(y[3, others], b[others]) and np.isnan(y[3, 5])  # denormal read as 0; 0 x Inf = NaN
