"""The native FusedEltwiseChain{k} kernel (custom_ops/native/ops/eltwise_chain/).

Models of unfused elementwise ops go through ``ortfuse.InferenceSession(fusion=True)`` (the report
must say the chain runs native) and are compared with the same model on stock onnxruntime at
ORT_DISABLE_ALL. Tolerances: ``EXACT`` (rtol 1e-5, atol 1e-6) for chains of ops computed with the
same float32 operations as ORT (Relu, LeakyRelu, Clip, HardSigmoid, Abs, Neg, Floor, Ceil, Sqrt,
Reciprocal, arithmetic, Max, Min, Pow; on this machine these came out bit-identical to ORT);
``POLY`` (rtol 2e-5, atol 2e-6) once a chain holds Sigmoid/Tanh/Exp/Erf/Log/Softplus/Pow:
vecmath's exp/tanh/erf/sigmoid are within 2.41 ulp (2.9e-7 relative; vecmath.MAX_ULP) of the exact value
(tests/test_vecmath.py), ORT's own are approximations too (its Sigmoid is 1e-1 relative off below
1e-10, hence the atol), and later steps such as Sub can amplify a few-ulp difference; the largest
relative difference seen in these tests was 2.4e-7. NaN must sit where ORT puts it
(``assert_allclose`` compares NaN positions), and so must +-Inf.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ortfuse
from ortfuse.custom_ops import reference
from ortfuse.custom_ops.native import availability, threads
from ortfuse.custom_ops.native.ops.eltwise_chain import encoding
from ortfuse.custom_ops.native.ops.eltwise_chain.encoding import CHAIN_OPS, MAX_STEPS, N_UNARY, node_attrs
from ortfuse.custom_ops.native.words import MAX_ATTR_WORDS
from ortfuse.custom_ops.registration import register_native
from ortfuse.custom_ops.specs import DOMAIN, MAX_CHAIN_OPERANDS
from ortfuse.fusion.rewrite import fuse
from ortfuse.fusion.rules import eltwise_chain as eltwise_pattern

pytestmark = pytest.mark.skipif(availability.unavailable_reason() is not None,
                                reason=f"native path unavailable: {availability.unavailable_reason()}")

CPU = ["CPUExecutionProvider"]
EXACT = {"rtol": 1e-5, "atol": 1e-6}
POLY = {"rtol": 2e-5, "atol": 2e-6}
POLY_OPS = {"Sigmoid", "Tanh", "Exp", "Log", "Erf", "Softplus", "Pow"}
OPSET = 17


# --------------------------------------------------------------------------------------------------
# building and running chain models
# --------------------------------------------------------------------------------------------------


def chain_model(x_shape, steps, operands=(), opset=OPSET) -> onnx.ModelProto:
    """A graph X -> steps -> Y of stock ONNX ops. A step is an op name (unary), ``(op, attrs)`` for
    LeakyRelu / HardSigmoid, ``("Clip", lo, hi)``, or ``(op, operand)`` / ``(op, operand, "first")``
    for a binary op whose other input is ``operand``: an int k (graph input Ck of shape
    ``operands[k]``) or a numpy array (an initializer); "first" puts the operand first."""
    nodes, inits = [], []
    cur = "X"
    for i, step in enumerate(steps):
        out = "Y" if i == len(steps) - 1 else f"t{i}"
        op = step if isinstance(step, str) else step[0]
        if isinstance(step, str):
            nodes.append(helper.make_node(op, [cur], [out], name=f"n{i}"))
        elif op == "Clip":
            lo, hi = f"lo{i}", f"hi{i}"
            inits += [numpy_helper.from_array(np.float32(step[1]).reshape(()), lo),
                      numpy_helper.from_array(np.float32(step[2]).reshape(()), hi)]
            nodes.append(helper.make_node(op, [cur, lo, hi], [out], name=f"n{i}"))
        elif isinstance(step[1], dict):
            nodes.append(helper.make_node(op, [cur], [out], name=f"n{i}", **step[1]))
        else:
            other = step[1]
            if not isinstance(other, int):
                name = f"k{i}"
                inits.append(numpy_helper.from_array(np.asarray(other, np.float32), name))
                other = name
            else:
                other = f"C{other}"
            ins = [other, cur] if len(step) > 2 and step[2] == "first" else [cur, other]
            nodes.append(helper.make_node(op, ins, [out], name=f"n{i}"))
        cur = out
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))]
    inputs += [helper.make_tensor_value_info(f"C{k}", TensorProto.FLOAT, list(s)) for k, s in enumerate(operands)]
    graph = helper.make_graph(nodes, "chain", inputs, [onnx.ValueInfoProto(name="Y")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    return model


def stock(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=CPU).run(None, feeds)[0]


def fused_session(model: onnx.ModelProto, kernel_prefix: str = "native") -> ortfuse.InferenceSession:
    """The ortfuse session of ``model``; its one eltwise_chain match must run on ``kernel_prefix``."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ortfuse.InferenceSession(model.SerializeToString(), so, providers=CPU, fusion=True,
                                    fusion_patterns=["eltwise_chain"])
    fused = [m for m in sess.fusion_report.matches if m.decision == "fused"]
    assert len(fused) == 1, sess.fusion_report.matches
    assert fused[0].kernel.startswith(kernel_prefix), fused[0].kernel
    assert len(fused[0].nodes) == len(model.graph.node)  # the whole chain is one op
    return sess


def check(model, feeds, tol=None, steps=None):
    """The fused (native) session gives stock ORT's output within ``tol`` (EXACT or POLY by the ops)."""
    if tol is None:
        ops = {n.op_type for n in model.graph.node}
        tol = POLY if ops & POLY_OPS else EXACT
    want = stock(model, feeds)
    got = fused_session(model).run(None, feeds)[0]
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(got, want, **tol)
    return got


def rand(shape, low=-3.0, high=3.0, seed=0):
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


# --------------------------------------------------------------------------------------------------
# encoding and selection
# --------------------------------------------------------------------------------------------------


def test_chain_ops_cover_the_grammar():
    reference_ops = set(reference.UNARY) | set(reference.BINARY) | {"LeakyRelu", "Clip", "HardSigmoid"}
    pattern_ops = eltwise_pattern.UNARY | eltwise_pattern.BINARY
    assert set(CHAIN_OPS) == reference_ops == pattern_ops
    assert set(CHAIN_OPS[:N_UNARY]) == eltwise_pattern.UNARY
    assert set(CHAIN_OPS[N_UNARY:]) == eltwise_pattern.BINARY


def test_node_attrs_encoding():
    program = [{"op": "Mul", "args": ["x", "c0"]}, {"op": "LeakyRelu", "alpha": 0.25},
               {"op": "Sub", "args": ["c3", "x"]}, {"op": "Clip", "min": -1.0, "max": float("inf")},
               {"op": "HardSigmoid", "alpha": 0.2, "beta": 0.5}, {"op": "Erf"}]
    attrs = node_attrs({"program": json.dumps(program)})
    code = CHAIN_OPS.index
    assert attrs["chain_ops"] == [code("Mul"), code("LeakyRelu"), code("Sub"), code("Clip"), code("HardSigmoid"),
                                  code("Erf")]
    assert attrs["chain_args"] == [0, -1, 2 * 3 + 1, -1, -1, -1]
    assert attrs["chain_params"] == [0.0, 0.0, 0.25, 0.0, 0.0, 0.0, -1.0, float("inf"), 0.2, 0.5, 0.0, 0.0]


@pytest.mark.parametrize(("program", "message"), [
    ([{"op": "Relu"}] * (MAX_STEPS + 1), "takes 1 to 12 steps"),
    ([{"op": "Add", "args": ["x", "x"]}], "one 'x' and one operand"),
    ([{"op": "Gelu"}], "no op 'Gelu'"),
    ([{"op": "Add", "args": ["x", "c4"]}], "at most 4 operands"),
    ([{"op": "Relu", "args": ["x", "c0"]}], "wrong number of arguments"),
])
def test_node_attrs_refuses_what_the_kernel_cannot_run(program, message):
    with pytest.raises(ValueError, match=message):
        node_attrs({"program": json.dumps(program)})


def test_fused_node_carries_program_native_attributes_and_provenance():
    model = chain_model([2, 8], [("Mul", np.float32(0.5)), ("Add", 0), "Tanh"], [[8]])
    fused, report = fuse(model, ["eltwise_chain"])
    (node,) = [n for n in fused.graph.node if n.domain == DOMAIN]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert node.op_type == "FusedEltwiseChain2" and report.matches[0].kernel.startswith("native numba")
    assert json.loads(attrs["program"])[1] == {"op": "Add", "args": ["x", "c1"]}
    assert attrs["chain_ops"] == [CHAIN_OPS.index(o) for o in ("Mul", "Add", "Tanh")]
    assert attrs["chain_args"] == [0, 2, -1]
    assert attrs["pattern_id"] == b"eltwise_chain" and attrs["replaced_nodes"] == b"n0,n1,n2"
    # the reference path gets the same node without the native attributes
    ref, report = fuse(model, ["eltwise_chain"], kernels="reference")
    (node,) = [n for n in ref.graph.node if n.domain == DOMAIN]
    assert node.op_type == "FusedEltwiseChain2Ref" and report.matches[0].kernel.startswith("reference")
    assert {a.name for a in node.attribute} == {"program", "pattern_id", "replaced_nodes"}


def test_chain_longer_than_max_steps_falls_back_to_reference():
    steps = (["Neg", "Tanh", ("LeakyRelu", {"alpha": 0.5})] * MAX_STEPS)[:MAX_STEPS + 1]
    model = chain_model([3, 5], steps)
    feeds = {"X": rand((3, 5))}
    sess = fused_session(model, kernel_prefix="reference")
    np.testing.assert_allclose(sess.run(None, feeds)[0], stock(model, feeds), **POLY)
    model = chain_model([3, 5], steps[:MAX_STEPS])
    check(model, feeds)


def test_options_first_used_without_reference_ops_leave_a_later_reference_match_to_ort():
    """Options first used for a model with only native kernels are registered without the reference
    (Python) ops; a later model on them whose match needs a reference kernel runs that match as ORT
    does (lowered fusions only), with a warning that says why, and the same results as stock ORT."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    short = chain_model([3, 5], ["Neg", "Tanh"])
    feeds = {"X": rand((3, 5))}
    first = ortfuse.InferenceSession(short, so, providers=CPU, fusion=True, fusion_patterns=["eltwise_chain"])
    assert first.fusion_report.fused[0].kernel.startswith("native")
    long = chain_model([3, 5], (["Neg", "Tanh", ("LeakyRelu", {"alpha": 0.5})] * MAX_STEPS)[:MAX_STEPS + 1])
    with pytest.warns(UserWarning, match=r"without the reference \(Python\) ops"):
        second = ortfuse.InferenceSession(long, so, providers=CPU, fusion=True, fusion_patterns=["eltwise_chain"])
    assert second.fusion_report.fused == [], second.fusion_report.table()
    np.testing.assert_array_equal(second.run(None, feeds)[0], stock(long, feeds))
    np.testing.assert_allclose(first.run(None, feeds)[0], stock(short, feeds), **POLY)


# --------------------------------------------------------------------------------------------------
# every op of the grammar
# --------------------------------------------------------------------------------------------------

# op -> (chain, operand shapes, X range)
GRAMMAR_CASES = {
    "Relu": (["Relu", ("Add", 0)], [[7]], (-3, 3)),
    "Sigmoid": ([("Mul", 0), "Sigmoid"], [[7]], (-12, 12)),
    "Tanh": (["Tanh", ("Mul", 0)], [[7]], (-6, 6)),
    "Exp": (["Exp", ("Sub", 0)], [[7]], (-80, 80)),
    "Log": (["Abs", "Log"], [], (-5, 5)),
    "Abs": (["Abs", ("Sub", 0, "first")], [[7]], (-3, 3)),
    "Neg": (["Neg", ("Max", 0)], [[7]], (-3, 3)),
    "Sqrt": (["Sqrt", ("Add", 0)], [[7]], (-1, 9)),
    "Reciprocal": (["Reciprocal", ("Mul", 0)], [[7]], (-2, 2)),
    "Erf": ([("Div", 0), "Erf"], [[7]], (-5, 5)),
    "Floor": (["Floor", ("Mul", 0)], [[7]], (-9, 9)),
    "Ceil": (["Ceil", ("Min", 0)], [[7]], (-9, 9)),
    "Softplus": (["Softplus", ("Sub", 0)], [[7]], (-30, 30)),
    "LeakyRelu": ([("LeakyRelu", {"alpha": 0.37}), ("Add", 0)], [[7]], (-3, 3)),
    "Clip": ([("Clip", -1.25, 2.5), ("Mul", 0)], [[7]], (-3, 3)),
    "HardSigmoid": ([("HardSigmoid", {"alpha": 0.3, "beta": 0.45}), ("Sub", 0)], [[7]], (-5, 5)),
    "Add": ([("Add", 0), "Neg"], [[1, 7]], (-3, 3)),
    "Sub": ([("Sub", 0), ("Sub", 1, "first")], [[7], [5, 1]], (-3, 3)),
    "Mul": ([("Mul", 0), ("Mul", 1, "first")], [[5, 1], []], (-3, 3)),
    "Div": ([("Div", 0), ("Div", 1, "first")], [[7], [5, 7]], (-3, 3)),
    "Pow": ([("Pow", np.float32(2.0)), ("Pow", np.float32(3.0)), ("Pow", np.float32(0.37)),
             ("Pow", np.array([0.5, 2.0, -1.0, 1.5, 3.0, 0.0, -2.5], np.float32))], [], (-2, 2)),
    "Max": ([("Max", 0), ("Max", 1, "first")], [[7], [5, 1]], (-3, 3)),
    "Min": ([("Min", 0), ("Min", 1, "first")], [[1, 7], [5, 7]], (-3, 3)),
}


def test_grammar_cases_cover_every_op():
    assert set(GRAMMAR_CASES) == set(CHAIN_OPS)


@pytest.mark.parametrize("op", list(GRAMMAR_CASES))
def test_every_op_of_the_grammar(op):
    steps, shapes, (low, high) = GRAMMAR_CASES[op]
    model = chain_model([5, 7], steps, shapes)
    feeds = {"X": rand((5, 7), low, high)}
    feeds.update({f"C{k}": rand(s, -2, 2, seed=k + 1) for k, s in enumerate(shapes)})
    check(model, feeds)


def test_pow_of_negative_base_and_special_exponents():
    x = np.array([-2, -1.5, -0.0, 0.0, 1.5, -np.inf, np.inf, np.nan, 3], np.float32)
    for exponent in (2.0, 3.0, 0.5, -1.0, -2.0, 1.5, 0.0):
        model = chain_model([9], [("Pow", np.float32(exponent)), "Neg"])
        check(model, {"X": x})


# --------------------------------------------------------------------------------------------------
# chains of 2-6 steps, 0-4 operands, broadcast shapes
# --------------------------------------------------------------------------------------------------

X_SHAPE = (2, 3, 4, 5)
BROADCASTS = {"scalar": [], "one": [1], "per_channel": [1, 3, 1, 1], "trailing": [5], "full": list(X_SHAPE),
              "middle": [3, 4, 1], "batch": [2, 1, 1, 1]}
SMOOTH_UNARY = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Erf", "Softplus", ("LeakyRelu", {"alpha": 0.1}),
                ("Clip", -1.5, 1.75), ("HardSigmoid", {"alpha": 0.25, "beta": 0.4})]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]


def random_chain(seed: int):
    """(steps, operand shapes): 2-6 steps, 0-4 operands, each used by at least one binary step."""
    rng = np.random.default_rng(seed)
    n_steps = int(rng.integers(2, 7))
    k = int(rng.integers(0, min(n_steps, MAX_CHAIN_OPERANDS) + 1))
    binary_at = sorted(rng.choice(n_steps, size=k, replace=False)) if k else []
    kinds = list(BROADCASTS)
    shapes = [BROADCASTS[kinds[int(rng.integers(len(kinds)))]] for _ in range(k)]
    steps = []
    for i in range(n_steps):
        if i in binary_at:
            operand = binary_at.index(i)
            op = BINARY[int(rng.integers(len(BINARY)))]
            steps.append((op, operand, "first") if rng.random() < 0.3 else (op, operand))
        else:
            steps.append(SMOOTH_UNARY[int(rng.integers(len(SMOOTH_UNARY)))])
    return steps, shapes


SEEDS = range(24)


def test_random_chains_cover_lengths_operand_counts_and_broadcasts():
    chains = [random_chain(seed) for seed in SEEDS]
    assert {len(steps) for steps, _ in chains} == {2, 3, 4, 5, 6}
    assert {len(shapes) for _, shapes in chains} == {0, 1, 2, 3, 4}
    assert {tuple(s) for _, shapes in chains for s in shapes} == {tuple(s) for s in BROADCASTS.values()}


@pytest.mark.parametrize("seed", SEEDS)
def test_random_chains_with_broadcast_operands(seed):
    steps, shapes = random_chain(seed)
    model = chain_model(X_SHAPE, steps, shapes)
    feeds = {"X": rand(X_SHAPE, seed=seed)}
    feeds.update({f"C{k}": rand(s, -2, 2, seed=100 * seed + k) for k, s in enumerate(shapes)})
    check(model, feeds)


@pytest.mark.parametrize("kind", list(BROADCASTS))
def test_each_broadcast_kind_with_four_operands(kind):
    shape = BROADCASTS[kind]
    steps = [("Add", 0), "Tanh", ("Mul", 1, "first"), ("Sub", 2), ("Max", 3), "Relu"]
    model = chain_model(X_SHAPE, steps, [shape, list(X_SHAPE), [5], [1, 3, 1, 1]])
    feeds = {"X": rand(X_SHAPE), "C0": rand(shape, seed=1), "C1": rand(X_SHAPE, seed=2), "C2": rand([5], seed=3),
             "C3": rand([1, 3, 1, 1], seed=4)}
    sess_out = check(model, feeds)
    assert sess_out.shape == X_SHAPE


def test_operand_that_enlarges_x_at_run_time():
    # shapes unknown when fusing: the output is the broadcast of X and the operands, as in ORT
    model = chain_model(["a", "b"], [("Add", 0), "Sigmoid", ("Mul", 1)], [["p", "q"], ["r", 1]])
    feeds = {"X": rand((1, 6)), "C0": rand((4, 1), seed=1), "C1": rand((4, 1), seed=2)}
    assert check(model, feeds).shape == (4, 6)
    feeds = {"X": rand((3, 1)), "C0": rand((1, 700), seed=1), "C1": rand((3, 1), seed=2)}  # row walk
    assert check(model, feeds).shape == (3, 700)


# --------------------------------------------------------------------------------------------------
# sizes, empty tensors, special values, layouts
# --------------------------------------------------------------------------------------------------

ODD_CHAIN = [("Mul", 0), ("Add", 1), "Tanh", ("Max", 2, "first"), ("Sub", 3)]


@pytest.mark.parametrize("n", [1, 17, 16385, (1 << 20) + 3])
def test_odd_sizes(n):
    model = chain_model(["n"], ODD_CHAIN, [[], ["n"], [1], ["n"]])
    feeds = {"X": rand((n,)), "C0": np.array(1.5, np.float32), "C1": rand((n,), seed=1),
             "C2": rand((1,), seed=2), "C3": rand((n,), seed=3)}
    check(model, feeds)


FIRST_STEP_OPERANDS = {"full": ["r", "c"], "row": ["c"], "column": ["r", 1], "scalar": []}


@pytest.mark.parametrize("op", [op for op in CHAIN_OPS if op != "Pow"])
@pytest.mark.parametrize(("rows", "inner"), [(3, 2500), (700, 9)], ids=["row_walk", "gather_walk"])
def test_every_op_as_the_first_step_over_several_chunks(op, rows, inner):
    # the first step reads X and writes the output chunk, later steps run in place on it
    x = rand((rows, inner), -3, 3)
    x[0, :5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    if CHAIN_OPS.index(op) < N_UNARY:
        first = {"LeakyRelu": ("LeakyRelu", {"alpha": 0.3}), "Clip": ("Clip", -1.0, 2.0),
                 "HardSigmoid": ("HardSigmoid", {"alpha": 0.3, "beta": 0.4})}.get(op, op)
        if op in ("Log", "Sqrt"):
            x = np.abs(x)
        check(chain_model(["r", "c"], [first, ("Add", 0), "Neg"], [[1]]), {"X": x, "C0": rand((1,), seed=1)})
        return
    for shape in FIRST_STEP_OPERANDS.values():
        sizes = [rows if d == "r" else inner if d == "c" else d for d in shape]
        feeds = {"X": x, "C0": rand(sizes, -2, 2, seed=1), "C1": rand((inner,), seed=2)}
        for order in ((op, 0), (op, 0, "first")):
            check(chain_model(["r", "c"], [order, ("Mul", 1), "Relu"], [shape, ["c"]]), feeds)


@pytest.mark.parametrize("rows", [1, 3, 257])
@pytest.mark.parametrize("inner", [1, 2, 17, 511, 512, 2049])
def test_trailing_and_channel_broadcast_over_odd_rows(rows, inner):
    model = chain_model(["r", "c"], [("Add", 0), "Relu", ("Mul", 1), ("Sub", 2, "first")],
                        [["c"], ["r", 1], [1, 1]])
    feeds = {"X": rand((rows, inner)), "C0": rand((inner,), seed=1), "C1": rand((rows, 1), seed=2),
             "C2": rand((1, 1), seed=3)}
    check(model, feeds)


@pytest.mark.parametrize(("x_shape", "c_shape"), [((0, 5), (5,)), ((3, 0, 2), (1, 1, 2)), ((0, 1, 5), (4, 5)),
                                                  ((0,), (1,))])
def test_zero_size_dims(x_shape, c_shape):
    model = chain_model(["a"] * len(x_shape), [("Add", 0), "Exp", ("Div", 0)], [["b"] * len(c_shape)])
    feeds = {"X": rand(x_shape), "C0": rand(c_shape, seed=1)}
    out = check(model, feeds)
    assert out.size == 0 and out.shape == np.broadcast_shapes(x_shape, c_shape)


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3e38, -3e38, 1.0, -1.0, 88.8, -104.0,
                    0.5, -0.5, 2.0, 1e-20, 7.5], np.float32)


@pytest.mark.parametrize("steps", [
    ["Relu", ("Max", 0), ("Min", 0, "first"), "Neg"],
    [("Clip", -1.0, 1.0), ("Div", 0), "Abs"],
    ["Sqrt", "Log", ("Sub", 0)],
    ["Reciprocal", "Floor", ("Mul", 0), "Ceil"],
    ["Exp", "Tanh", ("Add", 0), "Sigmoid"],
    ["Erf", "Softplus", ("LeakyRelu", {"alpha": 0.5}), ("HardSigmoid", {"alpha": 0.2, "beta": 0.5})],
    [("Pow", np.float32(3.0)), ("Add", 0), ("Pow", np.float32(0.5)), ("Pow", np.float32(2.0))],
], ids=["maxmin", "clipdiv", "sqrtlog", "recipfloor", "exptanh", "erfsoftplus", "pow"])
def test_nan_inf_and_signed_zeros(steps):
    model = chain_model([len(SPECIAL), len(SPECIAL)], steps, [[len(SPECIAL)]])
    x = np.repeat(SPECIAL[:, None], len(SPECIAL), axis=1)
    c = SPECIAL.copy()
    check(model, {"X": x, "C0": c})


def test_non_contiguous_inputs():
    model = chain_model(["a", "b", "c"], [("Mul", 0), "Tanh", ("Add", 1), ("Sub", 2, "first")],
                        [["b", "c"], ["c"], ["a", "b", "c"]])
    big = rand((6, 8, 40))
    x = big[::2, :, ::3]                          # strided
    c0 = rand((14, 8), seed=1).T                  # transposed
    c1 = rand((28,), seed=2)[::2]
    c2 = np.asfortranarray(rand((3, 8, 14), seed=3))
    assert not (x.flags.c_contiguous or c0.flags.c_contiguous or c1.flags.c_contiguous or c2.flags.c_contiguous)
    check(model, {"X": x, "C0": c0, "C1": c1, "C2": c2})


def test_rank_up_to_native_max():
    shape = (2, 1, 3, 1, 2, 1, 2, 1, 1, 2, 1, 3)
    c0, c1 = (1, 2, 1, 1, 2, 1, 3), (2,) + (1,) * 11
    model = chain_model(shape, [("Add", 0), "Relu", ("Mul", 1)], [c0, c1])
    feeds = {"X": rand(shape), "C0": rand(c0, seed=1), "C1": rand(c1, seed=2)}
    check(model, feeds)


# --------------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------------


def test_shapes_that_do_not_broadcast_raise_like_ort_and_the_session_keeps_working():
    model = chain_model(["a", "b"], [("Add", 0), "Relu", ("Mul", 1)], [["c"], ["d", "e"]])
    good = {"X": rand((2, 3)), "C0": rand((3,), seed=1), "C1": rand((2, 1), seed=2)}
    bad = [{**good, "C0": rand((4,), seed=1)}, {**good, "C1": rand((5, 3), seed=2)}]
    sess = fused_session(model)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=CPU)
    for feeds in bad:
        with pytest.raises(Exception) as stock_err:
            ref.run(None, feeds)
        with pytest.raises(type(stock_err.value),
                           match=r"FusedEltwiseChain2: input shapes \[.*\] and \[.*\] do not broadcast"):
            sess.run(None, feeds)
        np.testing.assert_allclose(sess.run(None, good)[0], ref.run(None, good)[0], **EXACT)


def _native_chain_model(k, attrs, x_shape=(2, 3)):
    node = helper.make_node(f"FusedEltwiseChain{k}", ["X"] + [f"C{i}" for i in range(k)], ["Y"], domain=DOMAIN,
                            program="[]", pattern_id="eltwise_chain", replaced_nodes="a,b", **attrs)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ["X"] + [f"C{i}" for i in range(k)]]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)])
    return model.SerializeToString()


@pytest.fixture(scope="module")
def native_options():
    names = [f"FusedEltwiseChain{k}" for k in range(MAX_CHAIN_OPERANDS + 1)]

    def make():
        so = ort.SessionOptions()
        so.log_severity_level = 4
        assert register_native(so, names)
        return so
    return make


def test_array_attributes_round_trip(native_options):
    # KernelInfoGetAttributeArray_int64 (163) and _float (162): distinctive values must arrive intact
    ops = [CHAIN_OPS.index(o) for o in ("LeakyRelu", "Clip", "Sub", "HardSigmoid")]
    params = [0.37109375, 0.0, -1.3125, 2.5625, 0.0, 0.0, 0.15625, 0.4375]
    model = _native_chain_model(1, {"chain_ops": ops, "chain_args": [-1, -1, 1, -1], "chain_params": params})
    sess = ort.InferenceSession(model, native_options(), providers=CPU)
    x, c = rand((2, 3), -4, 4), rand((3,), seed=1)
    program = json.dumps([{"op": "LeakyRelu", "alpha": params[0]}, {"op": "Clip", "min": params[2], "max": params[3]},
                          {"op": "Sub", "args": ["c0", "x"]},
                          {"op": "HardSigmoid", "alpha": params[6], "beta": params[7]}])
    np.testing.assert_array_equal(sess.run(None, {"X": x, "C0": c})[0], reference.eltwise_chain(x, c, program=program))


@pytest.mark.parametrize(("attrs", "message"), [
    ({"chain_ops": list(range(13)), "chain_args": [-1] * 13, "chain_params": [0.0] * 26},
     "attribute 'chain_ops' has more values than 12"),
    ({"chain_args": [-1], "chain_params": [0.0, 0.0]}, "attribute 'chain_ops' is required and missing"),
])
def test_bad_array_attributes_fail_session_creation(native_options, attrs, message):
    with pytest.raises(Exception, match=message):
        ort.InferenceSession(_native_chain_model(0, attrs), native_options(), providers=CPU)


@pytest.mark.parametrize("attrs", [
    {"chain_ops": [99], "chain_args": [-1], "chain_params": [0.0, 0.0]},             # unknown op
    {"chain_ops": [CHAIN_OPS.index("Add")], "chain_args": [2], "chain_params": [0.0, 0.0]},  # operand C1 of 1
    {"chain_ops": [0, 0], "chain_args": [-1], "chain_params": [0.0, 0.0]},          # lengths disagree
    {"chain_ops": [CHAIN_OPS.index("Relu")], "chain_args": [0], "chain_params": [0.0, 0.0]},  # unary with operand
])
def test_invalid_program_is_a_run_error(native_options, attrs):
    sess = ort.InferenceSession(_native_chain_model(1, attrs), native_options(), providers=CPU)
    with pytest.raises(Exception, match="do not form a valid program"):
        sess.run(None, {"X": rand((2, 3)), "C0": rand((3,))})


def test_threading_modes_agree():
    model = chain_model(["n", 64], [("Mul", 0), "Erf", ("Add", 1)], [[64], ["n", 1]])
    feeds = {"X": rand((5000, 64)), "C0": rand((64,), seed=1), "C1": rand((5000, 1), seed=2)}
    want = stock(model, feeds)
    before = threads.threading_settings()
    try:
        for mode, par_min in (("serial", 0), ("ort", 0), ("ort", -1)):
            threads.set_threading(mode, par_min)
            np.testing.assert_allclose(fused_session(model).run(None, feeds)[0], want, **POLY)
    finally:
        threads.set_threading(*before)


def test_module_constants_fit_the_kernel_state():
    assert encoding.W_PARAMS + 1 + 2 * MAX_STEPS <= MAX_ATTR_WORDS
