"""The mish pattern (ortfuse/fusion/rules/mish.py) and its native kernel FusedMish / FusedMishF16
(custom_ops/native/ops/mish.py).

The kernel: against Mish computed in float64 (x * tanh(log1p(e**x))) within ``mish.MAX_ULP`` float32
ulps over every 512th bit pattern in [-100, 100] and at special and extreme inputs (special values
exactly, signs of zero included); against the numpy reference of the rule's spec on odd sizes and
strided inputs; in float16 over all 65,536 values, bit for bit the float32 kernel rounded once; in
every ISA variant this CPU runs (a subprocess each).

The pattern: every spelling (Softplus -> Tanh -> Mul either order; Exp -> Add(1) -> Log -> Tanh ->
Mul, the 1 an initializer or a Constant node; the Mish op) fused by ``ortfuse.InferenceSession(...,
fusion=True)`` with the native kernel, giving the outputs of the unfused model on stock ORT at
ORT_DISABLE_ALL within rtol 1e-6 (8 float32 ulps: the kernel's bound and ORT's own few ulps from
exact) and atol 2e-6 (the decomposed spelling's float32 e**x + 1 keeps e**x only to half an ulp of 1,
2**-24: on ORT's side an absolute error up to |x| 2**-24, 1e-6 at x = -17, below which e**x + 1
rounds to 1), and within the kernel's ulp bound of the exact value; near-misses left as ORT runs
them (and to eltwise_chain); ``fuse`` and the catalogue knowing the id.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ortfuse
from ortfuse.custom_ops.native import availability
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.custom_ops.vecmath import ulp_error
from ortfuse.foundation import isa
from ortfuse.fusion import catalogue
from ortfuse.fusion.report import FUSED, REJECTED
from ortfuse.fusion.rules import mish as rule

from pattern_graphs import CPU, run_ortfuse, run_stock, tolerance

native = pytest.mark.skipif(availability.unavailable_reason() is not None,
                            reason=f"native path unavailable: {availability.unavailable_reason()}")
F16_ULP = 2.0**-10
MODEL_RTOL, MODEL_ATOL = 1e-6, 2e-6


def exact(x: np.ndarray) -> np.ndarray:
    """Mish in float64: x * tanh(log1p(e**x)) (logaddexp(0, x) = log1p(e**x) without overflow)."""
    with np.errstate(invalid="ignore"):
        x = np.asarray(x, dtype=np.float64)
        return x * np.tanh(np.logaddexp(0.0, x))


def f32_bits(value: float) -> int:
    return int(np.array([value], np.float32).view(np.uint32)[0])


SPECIALS = np.array([
    np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1.1754942e-38, -1.1754942e-38,
    1e-20, -1e-20, 19.99, 20.0, 20.01, 30.0, -30.0, -63.99999, -64.0, -64.00001, -87.3, -87.4, -100.0, -103.97,
    -104.0, -108.0, -108.7, -109.0, -127.0, -128.0, -129.0, -200.0, 1e3, -1e3, 1e30, -1e30,
    3.4028235e38, -3.4028235e38], np.float32)


# --------------------------------------------------------------------------------------------------
# the kernel
# --------------------------------------------------------------------------------------------------

def _span(x: np.ndarray) -> np.ndarray:
    from ortfuse.custom_ops.native.ops.mish import mish_span

    y = np.empty_like(x)
    mish_span(x, y, 0, x.size)
    return y


def _session(op_type: str = "FusedMish", elem: int = TensorProto.FLOAT, threads: int = 2) -> ort.InferenceSession:
    """One native node with a dynamic input shape and the provenance attributes a rewrite adds."""
    from ortfuse.custom_ops.registration import native_unavailable_reason, register_native

    node = helper.make_node(op_type, ["X"], ["Y"], domain=DOMAIN, name="fused", pattern_id="mish",
                            replaced_nodes="softplus,tanh,mul")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", elem, None)],
                              [helper.make_tensor_value_info("Y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    assert register_native(so, [op_type]), native_unavailable_reason([op_type])
    return ort.InferenceSession(model.SerializeToString(), so, providers=CPU)


def _dense_sweep(log2_step: int = 9) -> np.ndarray:
    """Every 2**log2_step-th float32 bit pattern in [-100, 100] (both signs)."""
    step = 1 << log2_step
    top = f32_bits(100.0)
    bits = np.concatenate([np.arange(0, top + 1, step), np.arange(0, top + 1, step) | 0x80000000])
    return bits.astype(np.uint32).view(np.float32)


@native
def test_dense_sweep_within_the_ulp_bound():
    from ortfuse.custom_ops.native.ops.mish import MAX_ULP

    x = np.concatenate([_dense_sweep(), SPECIALS])
    y = _span(x)
    err = ulp_error(y, exact(x))
    worst = int(np.argmax(err))
    assert np.isfinite(err).all(), x[~np.isfinite(err)]  # special values: exactly the exact result's
    assert err[worst] <= MAX_ULP, (float(x[worst]), float(err[worst]))
    assert err.max() > 1.0  # the sweep reaches the hard inputs (the bound is not vacuous)
    np.testing.assert_array_equal(_session().run(None, {"X": x})[0], y)  # the op runs this span


@native
def test_specials_and_extremes():
    y = _session().run(None, {"X": SPECIALS})[0]
    want = exact(SPECIALS)
    assert np.array_equal(np.isnan(y), np.isnan(want))
    assert np.isnan(y[3]) and y[2] == np.inf  # mish(-Inf) = -Inf * 0 = NaN; mish(+Inf) = +Inf
    zeros = y == 0
    assert np.array_equal(np.signbit(y[zeros]), np.signbit(SPECIALS[zeros]))  # -0 for -0 and far below 0
    big = np.abs(SPECIALS) >= 20
    positive = big & (SPECIALS > 0)
    np.testing.assert_array_equal(y[positive], SPECIALS[positive])  # tanh(softplus(x)) rounds to 1
    assert (y[np.isfinite(SPECIALS) & (SPECIALS <= -109)] == 0).all()  # the exact value rounds to -0 there
    from ortfuse.custom_ops.native.ops.mish import MAX_ULP

    assert ulp_error(y, want).max() <= MAX_ULP
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(y, rule.mish(SPECIALS), rtol=1e-6, atol=1e-41, equal_nan=True)


@native
@pytest.mark.parametrize("n", [0, 1, 7, 1023, 65537])
def test_odd_sizes_match_the_reference(n):
    rng = np.random.default_rng(n)
    x = rng.uniform(-30, 30, n).astype(np.float32)
    x[: min(n, SPECIALS.size)] = SPECIALS[: min(n, SPECIALS.size)]
    for shape in ((n,), (1, n, 1)):
        got = _session().run(None, {"X": x.reshape(shape)})[0]
        assert got.shape == shape and got.dtype == np.float32
        # the reference (float32 numpy) is itself a few ulps from exact: 8 ulps between the two
        np.testing.assert_allclose(got, rule.mish(x).reshape(shape), rtol=1e-6, atol=1e-41, equal_nan=True)


@native
def test_empty_and_strided_inputs():
    sess = _session()
    assert sess.run(None, {"X": np.zeros((3, 0, 5), np.float32)})[0].shape == (3, 0, 5)
    base = np.random.default_rng(1).uniform(-10, 10, (40, 66)).astype(np.float32)
    for view in (base[::3, 1::2], base.T[:33, :14].T, base[::-1, ::-5]):
        assert not view.flags.c_contiguous
        got = sess.run(None, {"X": view})[0]
        np.testing.assert_array_equal(got, _span(np.ascontiguousarray(view).ravel()).reshape(view.shape))


@native
def test_bad_rank_is_an_error_and_the_session_stays_usable():
    from ortfuse.custom_ops.native.words import MAX_RANK

    sess = _session()
    with pytest.raises(Exception, match=f"FusedMish: input 0 has rank {MAX_RANK + 1}"):
        sess.run(None, {"X": np.ones([1] * (MAX_RANK + 1), np.float32)})
    x = np.linspace(-5, 5, 11, dtype=np.float32)
    np.testing.assert_array_equal(sess.run(None, {"X": x})[0], _span(x))


@native
def test_float16_every_value():
    """FusedMishF16 over all 65,536 float16 values: the float32 kernel rounded to float16 once, bit for
    bit, hence within one float16 ulp of the exact value (NaN where it is NaN)."""
    x16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    got = _session("FusedMishF16", TensorProto.FLOAT16).run(None, {"X": x16})[0]
    assert got.dtype == np.float16
    want = _span(x16.astype(np.float32)).astype(np.float16)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))
    e = exact(x16.astype(np.float32))
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(got.astype(np.float64), e.astype(np.float16).astype(np.float64),
                                   rtol=F16_ULP, atol=2.0**-24, equal_nan=True)


ISA_PROBE = """
import json, numpy as np
from ortfuse.custom_ops.numba_setup import configure_numba
configure_numba()
from ortfuse.custom_ops.native.ops import mish as M
from ortfuse.foundation import isa
x = np.linspace(-30, 30, 4099, dtype=np.float32)
y = np.empty_like(x)
M.mish_span(x, y, 0, x.size)
y16 = np.empty(x.size, np.uint16)
M.mish_span(x.astype(np.float16).view(np.uint16), y16, 0, x.size)
ref16 = np.empty_like(x)
M.mish_span(x.astype(np.float16).astype(np.float32), ref16, 0, x.size)
width = isa.asm_vector_width(M.mish_span.inspect_asm(M.mish_span.signatures[0]))
worst, _where, bad = M._ulp_sweep(0, 1 << 32, 4099)
print(json.dumps({"width": width, "worst": worst, "bad": bad,
                  "f16_same": bool(np.array_equal(y16, ref16.astype(np.float16).view(np.uint16)))}))
"""


@native
@pytest.mark.parametrize("target", isa.KERNEL_ISAS)
def test_every_isa_variant(target, tmp_path):
    """Each ISA variant this CPU runs, compiled in a fresh process (new cache: its assembly is
    inspected): vectors of the level's width, within MAX_ULP over every 4099th bit pattern (the
    module's own sweep), float16 the same as float32 rounded once."""
    from ortfuse.custom_ops.native.ops.mish import MAX_ULP

    if target not in isa.supported_isas():
        pytest.skip(f"this CPU does not support {target}")
    env = {**os.environ, **isa.numba_env(target), "NUMBA_CACHE_DIR": str(tmp_path)}
    env.pop("ORTFUSE_ISA", None)
    proc = subprocess.run([sys.executable, "-c", ISA_PROBE], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["width"]["bits"] == isa.VECTOR_BITS[target], report
    assert report["bad"] == 0 and 1.0 < report["worst"] <= MAX_ULP and report["f16_same"], report


# --------------------------------------------------------------------------------------------------
# the pattern
# --------------------------------------------------------------------------------------------------

def _graph(spelling: str, elem: int = TensorProto.FLOAT, shape=(3, 1000)) -> onnx.ModelProto:
    """Mish of x written one way (``spelling``: one of SPELLINGS), y its output."""
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    inits, opset = [], 17
    if spelling.startswith("softplus"):
        mul = ["x", "t"] if spelling == "softplus_x_t" else ["t", "x"]
        nodes = [helper.make_node("Softplus", ["x"], ["s"], name="softplus"),
                 helper.make_node("Tanh", ["s"], ["t"], name="tanh"),
                 helper.make_node("Mul", mul, ["y"], name="mul")]
    elif spelling.startswith("exp"):
        if spelling == "exp_add_initializer":
            inits = [onnx.numpy_helper.from_array(np.array(1, dtype), "one")]
            const = []
        else:
            const = [helper.make_node("Constant", [], ["one"], name="one",
                                      value=helper.make_tensor("one", elem, [], [1.0]))]
        nodes = [*const, helper.make_node("Exp", ["x"], ["e"], name="exp"),
                 helper.make_node("Add", ["e", "one"] if inits else ["one", "e"], ["a"], name="add"),
                 helper.make_node("Log", ["a"], ["l"], name="log"),
                 helper.make_node("Tanh", ["l"], ["t"], name="tanh"),
                 helper.make_node("Mul", ["x", "t"], ["y"], name="mul")]
    else:
        nodes, opset = [helper.make_node("Mish", ["x"], ["y"], name="mish")], 18
    graph = helper.make_graph(nodes, "mish", [helper.make_tensor_value_info("x", elem, list(shape))],
                              [helper.make_tensor_value_info("y", elem, list(shape))], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


SPELLINGS = ["softplus_x_t", "softplus_t_x", "exp_add_initializer", "exp_add_constant_node", "mish_op"]
REPLACED = {"softplus_x_t": ["softplus", "tanh", "mul"], "softplus_t_x": ["softplus", "tanh", "mul"],
            "exp_add_initializer": ["exp", "add", "log", "tanh", "mul"],
            "exp_add_constant_node": ["exp", "add", "log", "tanh", "mul"], "mish_op": ["mish"]}


def _feeds(dtype=np.float32, shape=(3, 1000), seed=0) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).uniform(-30, 30, shape).astype(dtype).ravel()
    with np.errstate(over="ignore"):
        x[: SPECIALS.size] = SPECIALS.astype(dtype)  # float16: the large ones become +-Inf
    return {"x": x.reshape(shape)}


def _fused_session(model: onnx.ModelProto, **kwargs) -> ortfuse.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ortfuse.InferenceSession(model.SerializeToString(), so, providers=CPU, **kwargs)


@native
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_spelling_is_fused_with_the_native_kernel(spelling):
    model = _graph(spelling)
    feeds = _feeds()
    sess = _fused_session(model, fusion=True)
    report = sess.fusion_report
    fused = [(m.pattern_id, m.nodes, m.kernel) for m in report.fused]
    assert len(fused) == 1 and fused[0][:2] == ("mish", REPLACED[spelling]), report.table()
    assert fused[0][2].startswith("native"), report.table()
    got = sess.run(None, feeds)[0]
    ref = run_stock(model, feeds)[0]
    np.testing.assert_allclose(got, ref, rtol=MODEL_RTOL, atol=MODEL_ATOL, equal_nan=True)
    from ortfuse.custom_ops.native.ops.mish import MAX_ULP

    assert ulp_error(got, exact(feeds["x"])).max() <= MAX_ULP


@native
@pytest.mark.parametrize("spelling", ["softplus_t_x", "mish_op"])
def test_float16_models_run_fused_mish_f16(spelling):
    model = _graph(spelling, TensorProto.FLOAT16)
    feeds = _feeds(np.float16)
    sess = _fused_session(model, fusion=True)
    assert [(m.pattern_id, m.kernel.split()[0]) for m in sess.fusion_report.fused] == [("mish", "native")]
    assert "FusedMishF16" in {n.op_type for n in ortfuse.fuse(model)[0].graph.node}
    got = sess.run(None, feeds)[0]
    ref = run_stock(model, feeds)[0]
    assert got.dtype == np.float16
    rtol, atol = tolerance(np.float16, 0, 0)
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=rtol, atol=atol, equal_nan=True)


NEAR_MISSES = [e for e in rule.RULE.examples if e.reason]


def _example_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    out = {}
    for vi in model.graph.input:
        t = vi.type.tensor_type
        out[vi.name] = rng.uniform(-8, 8, [d.dim_value for d in t.shape.dim]).astype(
            helper.tensor_dtype_to_np_dtype(t.elem_type))
    return out


@pytest.mark.parametrize("example", NEAR_MISSES, ids=[e.name for e in NEAR_MISSES])
def test_a_near_miss_stays_as_ort_runs_it(example):
    model = example.build()
    feeds = _example_feeds(model)
    sess = _fused_session(model, fusion=True, fusion_patterns=["mish"])
    report = sess.fusion_report
    assert not report.applied and not report.fused, report.table()
    assert [(m.pattern_id, m.decision) for m in report.matches] == [("mish", REJECTED)], report.table()
    assert example.reason in report.matches[0].reason
    np.testing.assert_array_equal(sess.run(None, feeds)[0], run_stock(model, feeds)[0])
    assert len(NEAR_MISSES) >= 3


def test_a_near_miss_is_left_to_the_generic_chain():
    """Rejected by mish, Softplus -> Tanh -> Mul(z) is still an elementwise chain for eltwise_chain."""
    model = next(e for e in NEAR_MISSES if e.name == "times_another_tensor").build()
    _fused, report = ortfuse.fuse(model)
    decisions = [(m.pattern_id, m.decision) for m in report.matches]
    assert decisions == [("mish", REJECTED), ("eltwise_chain", FUSED)], report.table()


def test_mish_claims_the_chain_before_eltwise_chain():
    model = _graph("softplus_x_t")
    fused, report = ortfuse.fuse(model)
    assert [(m.pattern_id, m.decision) for m in report.matches] == [("mish", FUSED)], report.table()
    chain, chain_report = ortfuse.fuse(model, ["eltwise_chain"])  # what ortfuse did before the mish rule
    assert [m.pattern_id for m in chain_report.fused] == ["eltwise_chain"], chain_report.table()
    assert any(n.op_type.startswith("FusedEltwiseChain") for n in chain.graph.node)


def test_the_catalogue_and_fuse_know_mish():
    ids = catalogue.PATTERN_IDS
    assert "mish" in ids and ids.index("silu") < ids.index("mish") < ids.index("eltwise_chain")
    assert catalogue.validate_patterns(["mish"]) == ("mish",)
    assert catalogue.spec_for_op_type("FusedMishF16") is catalogue.SPECS["FusedMish"] is rule.SPEC
    with pytest.raises(catalogue.UnknownPatternError, match="mish"):
        catalogue.validate_patterns(["mishh"])
    model = _graph("exp_add_constant_node")
    fused, report = ortfuse.fuse(model, ["mish"])
    assert report.applied and [m.pattern_id for m in report.fused] == ["mish"], report.table()
    custom = [n for n in fused.graph.node if n.domain == DOMAIN]
    assert len(custom) == 1 and custom[0].op_type.startswith("FusedMish")
    attrs = {a.name: helper.get_attribute_value(a) for a in custom[0].attribute}
    assert attrs["pattern_id"] == b"mish" and attrs["replaced_nodes"] == b"exp,add,log,tanh,mul"
    assert len(fused.graph.node) == 1  # the Constant 1 is gone with the Add that read it
    feeds = _feeds()
    got = _fused_session(model, fusion=True, fusion_patterns=["mish"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, run_stock(model, feeds)[0], rtol=MODEL_RTOL, atol=MODEL_ATOL, equal_nan=True)


def test_reference_kernel_runs_the_spec():
    """The Python-op path (``kernels="reference"``) computes the rule's numpy reference."""
    model = _graph("softplus_x_t")
    fused, report = ortfuse.fuse(model, ["mish"], kernels="reference")
    assert [n.op_type for n in fused.graph.node if n.domain == DOMAIN] == ["FusedMishRef"], report.table()
    feeds = _feeds()
    got = run_ortfuse(fused, feeds)[0][0]
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, rule.mish(feeds["x"]))
