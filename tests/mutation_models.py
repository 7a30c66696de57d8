"""Mutated models for the reliability fuzzers (tests/test_mutation_fuzz.py, tools/fuzz_campaign.py).

A *base model* is a small valid graph in which ortfuse's patterns fire (Gemm / MatMul + bias +
activation, Conv [+BN] + activation, Add+Relu of two run-time tensors, HardSwish / SiLU / Gelu
spellings, elementwise chains), built with ``pattern_graphs.GraphBuilder``. A *mutation* then breaks
or bends it the way real files go wrong: a dropped node (dangling or rewired), an attribute of the
wrong type, a missing or bogus attribute, a shape lie in value_info or in a graph input / output,
swapped inputs, an initializer whose dtype or data disagrees, a renamed input, another opset, a
duplicated tensor name or a cycle.

``compare(model_bytes, feeds)`` is the property: stock ORT (default options) and
``ortfuse.InferenceSession(fusion=True)`` must either both succeed with outputs equal to stock ORT
at ORT_DISABLE_ALL (rtol 1e-4, atol 1e-5 x max(1, max|ref|), NaN where ORT gives NaN; when nothing
was fused, ORT ran the very same model, and stock ORT's outputs are the reference), or raise the
same exception class. ``compare(..., execution)`` runs both sides through ``run``, ORT's parallel
executor or ``run_async`` (``EXECUTIONS``). Choices go through a ``Chooser`` so hypothesis
(shrinking) and a plain seeded random generator (the campaign) drive the same code.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from pattern_graphs import CONV_EPILOGUES, GEMM_EPILOGUES, GraphBuilder, bn_params, tolerance

RTOL, ATOL = 1e-4, 1e-5
FAMILIES = ("gemm", "matmul", "conv", "add_relu", "eltwise")
MUTATIONS = ("drop_node", "drop_node_rewire", "attr_wrong_type", "attr_drop", "attr_bogus", "attr_value",
             "shape_lie_value_info", "shape_lie_input", "shape_lie_output", "dtype_lie_value_info",
             "swap_inputs", "init_dtype", "init_truncate", "rename_input", "opset", "duplicate_name", "cycle",
             "const_to_input", "feed_shape", "none")


class Chooser:
    """Random choices from a numpy Generator (the campaign); hypothesis supplies its own."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def choice(self, seq):
        seq = list(seq)
        return seq[int(self.rng.integers(0, len(seq)))]

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))


class HypothesisChooser:
    """The same interface over hypothesis' ``data.draw`` (so failing cases shrink)."""

    def __init__(self, data) -> None:
        from hypothesis import strategies as st

        self.data, self.st = data, st

    def choice(self, seq):
        return self.data.draw(self.st.sampled_from(list(seq)))

    def integer(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))


# ------------------------------------------------------------------------------------------------
# base models
# ------------------------------------------------------------------------------------------------
def _epilogue(c, table, opset):
    names = [n for n, (_, lo, hi, *_r) in table.items() if lo <= opset <= hi]
    return c.choice([None, *names])


def base_model(c) -> tuple[onnx.ModelProto, dict[str, np.ndarray], str]:
    """(model, feeds, description) of a small valid graph where a pattern fires."""
    family = c.choice(FAMILIES)
    opsets = [7, 9, 11, 13, 14, 17, 18, 20] if family in ("conv", "add_relu", "eltwise") else [9, 11, 13, 17, 20]
    opset = c.choice(opsets)
    b = GraphBuilder(opset=opset, seed=c.integer(0, 2**16))
    as_node = opset >= 11 and c.choice([False, True])
    desc = f"{family} opset {opset}"
    if family == "gemm":
        m, k, n = c.integer(1, 5), c.integer(1, 6), c.integer(1, 5)
        x = b.input("x", [m, k])
        t = b.op("Gemm", [x, b.const(b.weight((k, n)), as_node), b.const(b.weight(n, 0.3), as_node)], name="gemm")
        epi = _epilogue(c, GEMM_EPILOGUES, opset)
        if epi:
            t, _ = GEMM_EPILOGUES[epi][0](b, t, "e_", as_node=as_node)
    elif family == "matmul":
        k, n = c.integer(1, 6), c.integer(1, 5)
        seq = c.integer(1, 4)
        x = b.input("x", ["batch", seq, k], feed_shape=[c.integer(1, 3), seq, k])
        t = b.op("MatMul", [x, b.const(b.weight((k, n)), as_node)], name="mm")
        t = b.op("Add", [t, b.const(b.weight(n, 0.3), as_node)], name="bias")
        epi = _epilogue(c, GEMM_EPILOGUES, opset)
        if epi:
            t, _ = GEMM_EPILOGUES[epi][0](b, t, "e_", as_node=as_node)
    elif family == "conv":
        cin, cout, kk = c.integer(1, 3), c.integer(1, 4), c.integer(1, 3)
        hw = c.integer(kk, kk + 3)
        x = b.input("x", [c.integer(1, 2), cin, hw, hw])
        t = b.op("Conv", [x, b.const(b.weight((cout, cin, kk, kk)), as_node)], name="conv")
        if c.choice([False, True]):
            t = b.op("BatchNormalization", [t, *bn_params(b, cout, as_node)], name="bn")
        epi = _epilogue(c, CONV_EPILOGUES, opset)
        if epi:
            t, _ = CONV_EPILOGUES[epi][0](b, t, "e_", as_node=as_node and opset >= 11)
    elif family == "add_relu":
        shape = [c.integer(1, 4) for _ in range(c.integer(1, 3))]
        yshape = shape[c.integer(0, len(shape) - 1):]
        if c.choice([False, True]):  # symbolic dims: ORT checks nothing about them at run time
            x = b.input("x", [f"d{i}" for i in range(len(shape))], feed_shape=shape)
            y = b.input("y", [f"e{i}" for i in range(len(yshape))], feed_shape=yshape)
        else:
            x, y = b.input("x", shape), b.input("y", yshape)
        t = b.op("Relu", [b.op("Add", [x, y], name="add")], name="relu")
        epi = _epilogue(c, CONV_EPILOGUES, opset)
        if epi:
            t, _ = CONV_EPILOGUES[epi][0](b, t, "e_", as_node=as_node and opset >= 11)
    else:
        shape = [c.integer(1, 5) for _ in range(c.integer(1, 3))]
        t = b.input("x", shape)
        for i in range(c.integer(2, 4)):
            op = c.choice(["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Mul", "Add", "Sub", "Div"])
            if op in ("Mul", "Add", "Sub", "Div"):
                t = b.op(op, [t, b.const(np.float32(c.choice([0.5, 2.0, -1.5])), as_node)], name=f"s{i}")
            else:
                t = b.op(op, [t], name=f"s{i}")
        if c.choice([False, True]):
            t, _ = CONV_EPILOGUES["silu"][0](b, t, "e_")
    b.output(t)
    model = b.build()
    return model, b.feeds(c.integer(0, 2**16)), desc


# ------------------------------------------------------------------------------------------------
# mutations
# ------------------------------------------------------------------------------------------------
def _wrong_type_attr(c, attr: onnx.AttributeProto) -> onnx.AttributeProto:
    """The same attribute name carrying a value of another type."""
    kinds = {
        "int": lambda: helper.make_attribute(attr.name, c.integer(-2, 3)),
        "float": lambda: helper.make_attribute(attr.name, float(c.choice([0.5, -1.0, 3.0]))),
        "string": lambda: helper.make_attribute(attr.name, c.choice(["relu", "", "tanh", "1.5"])),
        "ints": lambda: helper.make_attribute(attr.name, [c.integer(0, 2), c.integer(0, 2)]),
        "floats": lambda: helper.make_attribute(attr.name, [0.5, 1.5]),
    }
    names = {onnx.AttributeProto.INT: "int", onnx.AttributeProto.FLOAT: "float", onnx.AttributeProto.STRING: "string",
             onnx.AttributeProto.INTS: "ints", onnx.AttributeProto.FLOATS: "floats"}
    current = names.get(attr.type)
    return kinds[c.choice([k for k in kinds if k != current])]()


def _value_infos(model: onnx.ModelProto) -> None:
    """Write ONNX's inferred value_info into the model, so shape lies have something to lie about."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        return
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)


def _lie_about(c, vi: onnx.ValueInfoProto) -> None:
    shape = vi.type.tensor_type.shape
    how = c.choice(["dim", "rank_up", "rank_down", "zero", "symbolic"])
    if how == "dim" and len(shape.dim):
        d = shape.dim[c.integer(0, len(shape.dim) - 1)]
        d.Clear()
        d.dim_value = c.integer(1, 9)
    elif how == "rank_up":
        shape.dim.add().dim_value = c.integer(1, 3)
    elif how == "rank_down" and len(shape.dim):
        del shape.dim[len(shape.dim) - 1]
    elif how == "zero" and len(shape.dim):
        d = shape.dim[c.integer(0, len(shape.dim) - 1)]
        d.Clear()
        d.dim_value = 0
    else:
        for d in shape.dim:
            d.Clear()
            d.dim_param = "n"


def mutate(c, model: onnx.ModelProto, feeds: dict, kind: str) -> tuple[onnx.ModelProto, dict, str]:
    """A mutated copy of ``model`` (and feeds), with a description of what was done."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    feeds = dict(feeds)
    compute = [n for n in g.node if n.op_type != "Constant"]
    if kind == "none" or not compute:
        return m, feeds, "unmutated"
    node = c.choice(compute)
    label = f"{node.name or node.op_type}({node.op_type})"
    if kind == "drop_node":
        g.node.remove(node)
        return m, feeds, f"dropped {label}"
    if kind == "drop_node_rewire":
        src = next((i for i in node.input if i), None)
        g.node.remove(node)
        if src is not None:
            for other in g.node:
                for j, name in enumerate(other.input):
                    if name == node.output[0]:
                        other.input[j] = src
            for out in g.output:
                if out.name == node.output[0]:
                    out.name = src
        return m, feeds, f"dropped {label}, consumers read {src}"
    if kind in ("attr_wrong_type", "attr_drop", "attr_value") and not node.attribute:
        kind = "attr_bogus"
    if kind == "attr_wrong_type":
        i = c.integer(0, len(node.attribute) - 1)
        old = node.attribute[i]
        new = _wrong_type_attr(c, old)
        node.attribute[i].CopyFrom(new)
        retyped = onnx.AttributeProto.AttributeType.Name(new.type)
        return m, feeds, f"attribute {old.name} of {label} retyped to {retyped}"
    if kind == "attr_drop":
        i = c.integer(0, len(node.attribute) - 1)
        name = node.attribute[i].name
        del node.attribute[i]
        return m, feeds, f"attribute {name} of {label} dropped"
    if kind == "attr_value":
        i = c.integer(0, len(node.attribute) - 1)
        a = node.attribute[i]
        if a.type == onnx.AttributeProto.FLOAT:
            a.f = float(c.choice([0.0, -1.0, 1e30, float("nan"), float("inf")]))
        elif a.type == onnx.AttributeProto.INT:
            a.i = c.choice([0, -1, 2, 7, 2**40])
        elif a.type == onnx.AttributeProto.INTS:
            a.ints[:] = [c.choice([0, -1, 3, 100]) for _ in a.ints] or [5]
        elif a.type == onnx.AttributeProto.STRING:
            a.s = c.choice([b"", b"bogus", b"NOTSET", b"tanh"])
        return m, feeds, f"attribute {a.name} of {label} given an odd value"
    if kind == "attr_bogus":
        node.attribute.append(helper.make_attribute(c.choice(["alpha", "axis", "bogus_attr", "activation"]),
                                                    c.choice([1, 0.5, "x"])))
        return m, feeds, f"extra attribute on {label}"
    if kind in ("shape_lie_value_info", "dtype_lie_value_info"):
        _value_infos(m)
        if not g.value_info:
            return m, feeds, "no value_info to lie about"
        vi = c.choice(g.value_info)
        if kind == "dtype_lie_value_info":
            vi.type.tensor_type.elem_type = c.choice([TensorProto.DOUBLE, TensorProto.INT64, TensorProto.FLOAT16])
            return m, feeds, f"value_info {vi.name} claims another dtype"
        _lie_about(c, vi)
        return m, feeds, f"value_info {vi.name} shape lie"
    if kind == "shape_lie_input":
        vi = c.choice(g.input)
        _lie_about(c, vi)
        return m, feeds, f"graph input {vi.name} shape lie"
    if kind == "shape_lie_output":
        vi = c.choice(g.output)
        _lie_about(c, vi)
        return m, feeds, f"graph output {vi.name} shape lie"
    if kind == "swap_inputs":
        multi = [n for n in compute if len([i for i in n.input if i]) >= 2]
        if not multi:
            return m, feeds, "no node with two inputs"
        n = c.choice(multi)
        n.input[0], n.input[1] = n.input[1], n.input[0]
        return m, feeds, f"swapped inputs 0 and 1 of {n.name or n.op_type}({n.op_type})"
    if kind in ("init_dtype", "init_truncate"):
        if not g.initializer:
            return m, feeds, "no initializer"
        t = c.choice(g.initializer)
        if kind == "init_dtype":
            t.data_type = c.choice([TensorProto.DOUBLE, TensorProto.INT32, TensorProto.FLOAT16, TensorProto.INT64])
            return m, feeds, f"initializer {t.name} relabelled as {TensorProto.DataType.Name(t.data_type)}"
        if t.raw_data:
            t.raw_data = t.raw_data[: len(t.raw_data) // 2]
        else:
            t.dims.append(2)
        return m, feeds, f"initializer {t.name} data truncated"
    if kind == "const_to_input":
        if not g.initializer:
            return m, feeds, "no initializer"
        t = c.choice(g.initializer)
        g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        try:
            arr = onnx.numpy_helper.to_array(t)
        except Exception:  # an earlier mutation broke its data: the declaration alone is the mutation
            arr = None
        if arr is not None and c.choice([False, True]):  # an overridable initializer, fed a different value
            feeds[t.name] = (arr * 1.5 + 0.25).astype(arr.dtype)
        return m, feeds, f"initializer {t.name} also a graph input"
    if kind == "feed_shape":  # a run-time shape the model did not expect (other size, rank, zero)
        name = c.choice(sorted(feeds))
        arr = feeds[name]
        how = c.choice(["grow", "shrink", "rank_up", "rank_down", "zero"])
        shape = list(arr.shape)
        if how == "grow" and shape:
            shape[c.integer(0, len(shape) - 1)] += c.integer(1, 3)
        elif how == "shrink" and shape:
            i = c.integer(0, len(shape) - 1)
            shape[i] = max(1, shape[i] - 1)
        elif how == "rank_up":
            shape = [c.integer(1, 2)] + shape
        elif how == "rank_down" and shape:
            shape = shape[1:]
        elif shape:
            shape[c.integer(0, len(shape) - 1)] = 0
        feeds[name] = np.random.default_rng(len(shape)).uniform(-3, 3, shape).astype(arr.dtype)
        return m, feeds, f"feed {name} given shape {shape} ({how})"
    if kind == "rename_input":
        vi = c.choice(g.input)
        old = vi.name
        vi.name = old + "_renamed"
        if c.choice([False, True]) and old in feeds:
            feeds[vi.name] = feeds.pop(old)  # consistent feeds: nodes still read the old name
        return m, feeds, f"graph input {old} renamed"
    if kind == "opset":
        for o in m.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = c.choice([1, 6, 7, 9, 11, 13, 17, 19, 21, onnx.defs.onnx_opset_version(), 99])
                return m, feeds, f"opset set to {o.version}"
    if kind == "duplicate_name":
        others = [n for n in compute if n is not node]
        if others and node.output:
            c.choice(others).output[0] = node.output[0]
        return m, feeds, f"a second node also writes {node.output[0] if node.output else ''}"
    if kind == "cycle":
        later = compute[compute.index(node):]
        target = c.choice(later)
        if node.input:
            node.input[0] = target.output[0]
        return m, feeds, f"{label} reads {target.output[0]} (cycle)"
    return m, feeds, f"{kind} not applicable"


def make_case(c, max_mutations: int = 2) -> tuple[bytes, dict, list[str]]:
    """A base model with 1..max_mutations mutations: (model bytes, feeds, descriptions)."""
    model, feeds, desc = base_model(c)
    steps = [desc]
    for _ in range(c.integer(1, max_mutations)):
        model, feeds, what = mutate(c, model, feeds, c.choice(MUTATIONS))
        steps.append(what)
    return model.SerializeToString(), feeds, steps


# ------------------------------------------------------------------------------------------------
# the property
# ------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    ok: bool
    outputs: list = field(default_factory=list)
    error: str = ""          # exception class name
    message: str = ""
    phase: str = ""          # "load" or "run"


# How a case is run, for both stock ORT and ortfuse: ``run``; ``parallel`` (ORT's parallel executor,
# two inter-op threads); ``run_async`` (the callback's error string stands for the exception, whose
# class ORT does not hand over: both must fail, or both succeed with equal outputs).
EXECUTIONS = ("run", "parallel", "run_async")
ASYNC_ERROR = "run_async error"


def _options(level=None, execution: str = "run") -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 2 if execution == "run_async" else 1  # ORT's run_async needs a pool thread
    if execution == "parallel":
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        so.inter_op_num_threads = 2
    if level is not None:
        so.graph_optimization_level = level
    return so


def _run_async(sess, feeds) -> list:
    done, got = threading.Event(), []
    sess.run_async(None, feeds, lambda outputs, _, err: (got.append((outputs, err)), done.set()), None)
    if not done.wait(120):
        raise TimeoutError("run_async never called back")
    outputs, err = got[0]
    if err:
        raise RuntimeError(f"{ASYNC_ERROR}: {err}")
    return outputs


def run(factory, feeds, execution: str = "run") -> tuple[Outcome, object]:
    phase = "load"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sess = factory()
        phase = "run"
        return Outcome(True, _run_async(sess, feeds) if execution == "run_async" else sess.run(None, feeds)), sess
    except Exception as exc:  # the class is what is compared
        error = ASYNC_ERROR if str(exc).startswith(ASYNC_ERROR) else type(exc).__name__
        return Outcome(False, error=error, message=str(exc)[:300], phase=phase), None


def _close(got: list, ref: list) -> str:
    """"" if ``got`` equals ``ref`` within the tolerance, else what differs."""
    if len(got) != len(ref):
        return f"{len(got)} outputs, ORT gives {len(ref)}"
    for i, (g, r) in enumerate(zip(got, ref)):
        g, r = np.asarray(g), np.asarray(r)
        if g.shape != r.shape or g.dtype != r.dtype:
            return f"output {i}: {g.dtype}{g.shape}, ORT gives {r.dtype}{r.shape}"
        if r.dtype.kind != "f":
            if not np.array_equal(g, r):
                return f"output {i} differs"
            continue
        finite = np.abs(r[np.isfinite(r)])
        scale = max(1.0, float(finite.max())) if finite.size else 1.0
        try:
            rtol, atol = tolerance(r.dtype, RTOL, ATOL)
            np.testing.assert_allclose(g, r, rtol=rtol, atol=atol * scale, equal_nan=True)
        except AssertionError as exc:
            return f"output {i}: {str(exc).strip().splitlines()[-3:]}"
    return ""


@dataclass
class Verdict:
    kind: str                # "both_ok", "both_raised", "mismatch"
    detail: str = ""
    fused: bool = False      # ortfuse applied a fusion
    stock: Outcome | None = None
    ours: Outcome | None = None


def compare(model_bytes: bytes, feeds: dict, execution: str = "run") -> Verdict:
    """Stock ORT vs ortfuse(fusion=True) on one model, both run the ``execution`` way: see the module docstring."""
    import ortfuse

    stock, _ = run(lambda: ort.InferenceSession(model_bytes, _options(execution=execution),
                                                providers=["CPUExecutionProvider"]), feeds, execution)
    ours, sess = run(lambda: ortfuse.InferenceSession(model_bytes, _options(execution=execution),
                                                      providers=["CPUExecutionProvider"], fusion=True),
                     feeds, execution)
    fused = bool(sess is not None and sess.fusion_report.applied)
    if not stock.ok:
        if ours.ok:
            return Verdict("mismatch", f"stock ORT raised {stock.error} ({stock.phase}: {stock.message[:160]}); "
                                       "ortfuse succeeded", fused, stock, ours)
        if ours.error != stock.error:
            return Verdict("mismatch", f"stock ORT raised {stock.error} ({stock.phase}: {stock.message[:160]}); "
                                       f"ortfuse raised {ours.error} ({ours.phase}: {ours.message[:160]})",
                           fused, stock, ours)
        return Verdict("both_raised", stock.error, fused, stock, ours)
    if not ours.ok:
        return Verdict("mismatch", f"stock ORT succeeded; ortfuse raised {ours.error} ({ours.phase}: "
                                   f"{ours.message[:200]})", fused, stock, ours)
    ref = stock  # unfused, ortfuse handed ORT the same model: stock's outputs are the reference
    if fused:
        ref, _ = run(lambda: ort.InferenceSession(model_bytes, _options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                                                  providers=["CPUExecutionProvider"]), feeds)
    diff = _close(ours.outputs, ref.outputs if ref.ok else stock.outputs)
    if diff:
        return Verdict("mismatch", f"outputs differ from stock ORT{'' if ref.ok else ' (default level)'}: {diff}",
                       fused, stock, ours)
    return Verdict("both_ok", "", fused, stock, ours)


def save_case(directory: str, name: str, model_bytes: bytes, feeds: dict, note: str) -> str:
    """Write ``<name>.onnx``, ``<name>.npz`` (feeds) and ``<name>.txt`` (what happened)."""
    os.makedirs(directory, exist_ok=True)
    base = os.path.join(directory, name)
    with open(base + ".onnx", "wb") as fh:
        fh.write(model_bytes)
    np.savez(base + ".npz", **feeds)
    with open(base + ".txt", "w") as fh:
        fh.write(note.rstrip() + "\n")
    return base + ".onnx"


def load_case(onnx_path: str) -> tuple[bytes, dict]:
    with open(onnx_path, "rb") as fh:
        data = fh.read()
    feeds = {}
    npz = onnx_path[:-5] + ".npz"
    if os.path.exists(npz):
        with contextlib.closing(np.load(npz)) as f:
            feeds = {k: f[k] for k in f.files}
    return data, feeds
