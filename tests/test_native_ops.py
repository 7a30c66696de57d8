"""Native fused ops against their numpy references (custom_ops/reference.py): odd sizes, broadcast
shapes, strided inputs, NaN/Inf, empty tensors, every threading mode, bad inputs at run time and
concurrent runs of one session."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortfuse.custom_ops import reference
from ortfuse.custom_ops.native import availability, threads
from ortfuse.custom_ops.native.elementwise import BLOCK
from ortfuse.custom_ops.native.ops.gemm import NATIVE_GEMM_EPILOGUES
from ortfuse.custom_ops.native.words import MAX_RANK
from ortfuse.custom_ops.registration import native_unavailable_reason, register_native
from ortfuse.custom_ops.specs import DOMAIN

pytestmark = pytest.mark.skipif(availability.unavailable_reason() is not None,
                                reason=f"native path unavailable: {availability.unavailable_reason()}")

OPS = ["FusedAddRelu", "FusedHardSwish", "FusedSiLU", "FusedGemmAct", "FusedNanToZero"]
HARDSWISH = {"add": 3.0, "lo": 0.0, "hi": 6.0, "div": 6.0}


def _model(op_type, inputs, attrs=None):
    """One fused node with dynamic input shapes and the provenance attributes a rewrite adds."""
    attrs = {"pattern_id": "test", "replaced_nodes": "a,b", **(attrs or {})}
    node = helper.make_node(op_type, list(inputs), ["Out"], domain=DOMAIN, name="fused", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs],
                              [helper.make_tensor_value_info("Out", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    return model.SerializeToString()


@pytest.fixture(scope="module")
def session():
    """session(op_type, inputs, attrs) -> InferenceSession with the native ops registered."""
    cache = {}

    def make(op_type, inputs, attrs=None, threads=2):
        key = (op_type, tuple(inputs), tuple(sorted((attrs or {}).items())), threads)
        if key not in cache:
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            assert register_native(so, OPS), native_unavailable_reason(OPS)
            cache[key] = ort.InferenceSession(_model(op_type, inputs, attrs), so, providers=["CPUExecutionProvider"])
        return cache[key]

    return make


@pytest.fixture(params=["serial", "ort", "numba"])
def threading_mode(request):
    """Each threading mode, splitting work from the first element so blocks really run in parallel."""
    if request.param == "numba" and not threads.numba_threads_ok():
        pytest.skip("numba's threading layer here is neither omp nor tbb")
    saved = threads.threading_settings()
    threads.set_threading(request.param, 0 if request.param != "serial" else -1)
    yield request.param
    threads.set_threading(*saved)


def _specials(n, rng):
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0, -3.0, 1e30, -1e30, 1e-40], np.float32)
    x[: min(n, specials.size)] = specials[: min(n, specials.size)]
    return x


def _assert_same(got, want, exact=True):
    assert got.shape == want.shape and got.dtype == np.float32
    if exact:
        np.testing.assert_array_equal(got, want)  # NaN == NaN here; signs of zero are not compared
        assert np.array_equal(np.signbit(got[got == 0]), np.signbit(want[want == 0]))
    else:
        np.testing.assert_allclose(got, want, rtol=3e-6, atol=1e-37, equal_nan=True)


# --------------------------------------------------------------------------------------------------
# FusedAddRelu
# --------------------------------------------------------------------------------------------------

BROADCASTS = [
    ((7,), (7,)), ((1023,), (1023,)), ((3, 5), (5,)), ((3, 5), (3, 1)), ((2, 3, 5), (1, 3, 1)),
    ((2, 1, 5), (3, 1)), ((), (5,)), ((1,), (1,)), ((5,), (1,)), ((2, 3, 5, 7), (2, 1, 5, 1)),
    ((4, 1, 9), (4, 11, 1)), ((1, 1), (1, 1)), ((300, 77), (77,)), ((77, 300), (77, 1)),
    ((BLOCK + 3,), (BLOCK + 3,)), ((3, BLOCK + 1), (BLOCK + 1,)), ((2 * BLOCK + 5, 3), (3,)),
    ((7, 0, 3), (3,)), ((0,), (1,)), ((2, 0), (2, 1)),
]


@pytest.mark.parametrize(("sa", "sb"), BROADCASTS, ids=[f"{a}+{b}" for a, b in BROADCASTS])
def test_add_relu_matches_reference(session, threading_mode, sa, sb):
    rng = np.random.default_rng(abs(hash((sa, sb))) % 2**32)
    sess = session("FusedAddRelu", ["A", "B"])
    for a_shape, b_shape in ((sa, sb), (sb, sa)):
        a = _specials(int(np.prod(a_shape)), rng).reshape(a_shape)
        b = _specials(int(np.prod(b_shape)), rng)[::-1].copy().reshape(b_shape)
        with np.errstate(invalid="ignore"):
            want = reference.add_relu(a, b)
        _assert_same(sess.run(None, {"A": a, "B": b})[0], want)


def test_add_relu_strided_inputs(session):
    rng = np.random.default_rng(3)
    base = rng.standard_normal((40, 66)).astype(np.float32)
    a = base[::3, 1::2]          # non-contiguous view
    b = base.T[:33, :14].T       # transposed view, shape (14, 33)
    assert not a.flags.c_contiguous and not b.flags.c_contiguous and a.shape == b.shape
    sess = session("FusedAddRelu", ["A", "B"])
    _assert_same(sess.run(None, {"A": a, "B": b})[0], reference.add_relu(a, b))
    _assert_same(sess.run(None, {"A": a, "B": b[0]})[0], reference.add_relu(a, b[0]))


def test_add_relu_bad_shapes_raise_and_session_survives(session):
    sess = session("FusedAddRelu", ["A", "B"])
    a = np.ones((3, 4), np.float32)
    with pytest.raises(Exception, match=r"FusedAddRelu: input shapes \[3,4\] and \[3\] do not broadcast"):
        sess.run(None, {"A": a, "B": np.ones(3, np.float32)})
    with pytest.raises(Exception, match=r"FusedAddRelu: input shapes \[2,3,4\] and \[5,1,1\] do not broadcast"):
        sess.run(None, {"A": np.ones((2, 3, 4), np.float32), "B": np.ones((5, 1, 1), np.float32)})
    with pytest.raises(Exception, match="(?i)type"):  # wrong dtype: ORT itself refuses float64 for a float input
        sess.run(None, {"A": a.astype(np.float64), "B": a})
    _assert_same(sess.run(None, {"A": a, "B": -a[0]})[0], np.zeros((3, 4), np.float32))


def test_rank_above_limit_is_an_error(session):
    sess = session("FusedSiLU", ["X"])
    x = np.ones((1,) * (MAX_RANK + 1), np.float32)
    with pytest.raises(Exception, match=f"FusedSiLU: input 0 has rank {MAX_RANK + 1}, more than the "
                                        f"supported {MAX_RANK}"):
        sess.run(None, {"X": x})
    x = np.ones((1,) * MAX_RANK, np.float32)
    assert sess.run(None, {"X": x})[0].shape == x.shape


# --------------------------------------------------------------------------------------------------
# unary ops
# --------------------------------------------------------------------------------------------------

SIZES = [(), (1,), (7,), (3, 0, 5), (1023,), (BLOCK - 1,), (BLOCK + 1,), (3, 7, BLOCK // 3 + 5), (100_003,)]


@pytest.mark.parametrize("shape", SIZES, ids=str)
@pytest.mark.parametrize("attrs", [HARDSWISH, {"add": 1.5, "lo": -1.0, "hi": 2.5, "div": 3.0}], ids=["std", "odd"])
def test_hardswish_matches_reference(session, threading_mode, shape, attrs):
    rng = np.random.default_rng(len(shape))
    x = _specials(int(np.prod(shape)), rng).reshape(shape)
    with np.errstate(invalid="ignore", over="ignore"):
        want = reference.hardswish(x, **attrs)
    _assert_same(session("FusedHardSwish", ["X"], attrs).run(None, {"X": x})[0], want)


@pytest.mark.parametrize("shape", SIZES, ids=str)
def test_silu_matches_reference(session, threading_mode, shape):
    rng = np.random.default_rng(len(shape) + 11)
    x = _specials(int(np.prod(shape)), rng).reshape(shape)
    if x.ndim and x.size:
        x[..., -1] = 100.0  # exp(-100) underflows to 0 in float32
    with np.errstate(invalid="ignore", over="ignore"):
        want = reference.silu(x)
    _assert_same(session("FusedSiLU", ["X"]).run(None, {"X": x})[0], want, exact=False)


@pytest.mark.parametrize("shape", SIZES, ids=str)
def test_nan_to_zero_matches_reference(session, threading_mode, shape):
    """Where(IsNaN(x), 0, x) bit for bit: infinities, -0 and subnormals kept, every NaN +0."""
    rng = np.random.default_rng(len(shape) + 23)
    x = _specials(int(np.prod(shape)), rng).reshape(shape)
    if x.size > 20:
        x.reshape(-1)[rng.integers(0, x.size, x.size // 7)] = np.nan
    want = np.where(np.isnan(x), np.float32(0.0), x)
    got = session("FusedNanToZero", ["X"]).run(None, {"X": x})[0]
    _assert_same(got, want)
    assert not np.isnan(got).any()


def test_unary_strided_input(session):
    x = np.linspace(-8, 8, 400, dtype=np.float32).reshape(20, 20)[:, ::3]
    assert not x.flags.c_contiguous
    _assert_same(session("FusedHardSwish", ["X"], HARDSWISH).run(None, {"X": x})[0],
                 reference.hardswish(x, **HARDSWISH))
    _assert_same(session("FusedSiLU", ["X"]).run(None, {"X": x})[0], reference.silu(x), exact=False)


def test_division_loops_hint_the_lines_ahead(tmp_path):
    """The spans whose loop divides or computes exp per element, and the chain's polynomial steps,
    hint the lines of the elements ahead (prefetcht0 for inputs, prefetchw for the output; why:
    elementwise.hint_ahead; measure: tools/kernel_bench.py --cases silu_f16). Compiled in a process
    with an empty cache: code loaded from the cache carries no assembly text."""
    code = """
        import numpy as np
        from ortfuse.custom_ops.native.ops import hardswish, silu
        from ortfuse.custom_ops.native.ops.eltwise_chain import encoding, steps
        f32, u16, one = np.zeros(8, np.float32), np.zeros(8, np.uint16), np.float32(1)
        compiled = [(silu.silu_span, (f32, f32, 0, 8)), (silu.silu_span, (u16, u16, 0, 8)),
                    (hardswish.hardswish_span, (f32, f32, 0, 8, one, one, one, one)),
                    (hardswish.hardswish_span_f16, (u16, u16, 0, 8, one, one, one, one)),
                    (steps.unary_step, (f32, f32, True, encoding.OP_TANH, one, one, 0, 0, 0))]
        for fn, args in compiled:
            fn(*args)
            asm = fn.inspect_asm(tuple(fn.typeof_pyval(a) for a in args))
            print(fn.__name__, asm.count("prefetchw"), asm.count("prefetcht0"))
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}, check=False)
    assert proc.returncode == 0, proc.stderr
    counts = [line.split() for line in proc.stdout.splitlines()]
    assert len(counts) == 5, proc.stdout
    for _name, writes, reads in counts:
        assert int(writes) > 0 and int(reads) > 0, proc.stdout


def test_hardswish_missing_attribute_fails_session_creation():
    so = ort.SessionOptions()
    assert register_native(so, OPS)
    with pytest.raises(Exception, match="FusedHardSwish: attribute 'div' is required and missing"):
        ort.InferenceSession(_model("FusedHardSwish", ["X"], {"add": 3.0, "lo": 0.0, "hi": 6.0}), so,
                             providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------------------------------
# FusedGemmAct
# --------------------------------------------------------------------------------------------------

GEMM_SHAPES = [((1, 1), 1), ((5, 7), 3), ((2, 3, 17), 9), ((33, 64), 40), ((4, 2, 3, 300), 513), ((0, 5), 4),
               ((3, 0), 2), ((6,), 5)]


@pytest.mark.parametrize(("x_shape", "n"), GEMM_SHAPES, ids=str)
@pytest.mark.parametrize("activation", ["", "relu", "gelu", "gelu_tanh", "silu", "relu+gelu"])
def test_gemm_act_matches_reference(session, x_shape, n, activation):
    rng = np.random.default_rng(n)
    k = x_shape[-1]
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal((k, n)) / max(1, np.sqrt(k))).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    attrs = {"activation": activation} if activation else {}
    got = session("FusedGemmAct", ["X", "W", "B"], attrs).run(None, {"X": x, "W": w, "B": b})[0]
    want = reference.gemm_act(x, w, b, activation_kind=activation)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * max(1.0, float(np.abs(want).max(initial=0))))


def test_gemm_act_parallel_modes_agree(session, threading_mode):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 50, 64)).astype(np.float32)
    w = rng.standard_normal((64, 96)).astype(np.float32) / 8
    b = rng.standard_normal(96).astype(np.float32)
    got = session("FusedGemmAct", ["X", "W", "B"], {"activation": "gelu"}).run(None, {"X": x, "W": w, "B": b})[0]
    np.testing.assert_allclose(got, reference.gemm_act(x, w, b, activation_kind="gelu"), rtol=2e-5, atol=2e-5)


def test_gemm_act_bad_shapes_raise_and_session_survives(session):
    sess = session("FusedGemmAct", ["X", "W", "B"], {"activation": "relu"})
    x, w, b = np.ones((2, 5), np.float32), np.ones((4, 3), np.float32), np.ones(3, np.float32)
    with pytest.raises(Exception, match=r"FusedGemmAct: W must have shape \[K, N\] with K = last dim of X; "
                                        r"got X \[2,5\] and W \[4,3\]"):
        sess.run(None, {"X": x, "W": w, "B": b})
    with pytest.raises(Exception, match=r"FusedGemmAct: B must have shape \[N\] with N = W's last dim; "
                                        r"got W \[5,3\] and B \[2\]"):
        sess.run(None, {"X": x, "W": np.ones((5, 3), np.float32), "B": np.ones(2, np.float32)})
    with pytest.raises(Exception, match="FusedGemmAct: X must have rank >= 1"):
        sess.run(None, {"X": np.array(1, np.float32), "W": w, "B": b})
    np.testing.assert_array_equal(sess.run(None, {"X": x, "W": np.ones((5, 3), np.float32), "B": b})[0],
                                  np.full((2, 3), 6, np.float32))


def test_gemm_act_unknown_activation_fails_session_creation():
    so = ort.SessionOptions()
    assert register_native(so, OPS)
    with pytest.raises(Exception, match="FusedGemmAct: attribute 'activation' has unsupported value 'relu\\+mish'; "
                                        "expected '\\+'-joined tokens from: " + ", ".join(NATIVE_GEMM_EPILOGUES)):
        ort.InferenceSession(_model("FusedGemmAct", ["X", "W", "B"], {"activation": "relu+mish"}), so,
                             providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------------------------------
# concurrency
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["ort", "numba"])
def test_eight_threads_share_one_session(session, mode):
    if mode == "numba" and not threads.numba_threads_ok():
        pytest.skip("numba's threading layer here is neither omp nor tbb")
    saved = threads.threading_settings()
    threads.set_threading(mode, 0)
    try:
        sess = session("FusedAddRelu", ["A", "B"])
        rng = np.random.default_rng(8)
        feeds = [{"A": rng.standard_normal((37, BLOCK // 8 + 3)).astype(np.float32),
                  "B": rng.standard_normal(BLOCK // 8 + 3).astype(np.float32)} for _ in range(8)]
        expected = [sess.run(None, f)[0] for f in feeds]
        errors, results = [], [[] for _ in feeds]
        start = threading.Barrier(len(feeds))

        def work(i):
            try:
                start.wait()
                for _ in range(15):
                    results[i].append(sess.run(None, feeds[i])[0])
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(i,)) for i in range(len(feeds))]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        assert not errors
        for i, outs in enumerate(results):
            assert len(outs) == 15 and all(np.array_equal(o, expected[i]) for o in outs)
            np.testing.assert_array_equal(expected[i], reference.add_relu(feeds[i]["A"], feeds[i]["B"]))
    finally:
        threads.set_threading(*saved)
