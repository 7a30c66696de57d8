"""Small graph builders shared by the tests/test_patterns_*.py modules and test_pattern_fuzz.py.

``GraphBuilder`` writes ONNX graphs the way exporters do (initializers or ``Constant`` nodes,
optional node names) and records how to feed every graph input; ``run_stock`` runs a model on
stock onnxruntime with every graph optimisation off, the reference every fused model is compared
against; ``run_ortfuse`` runs a model through ``ortfuse.InferenceSession``.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

import ortfuse
from ortfuse.custom_ops.specs import DOMAIN

SQRT2 = float(np.sqrt(2.0))
SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
CPU = ["CPUExecutionProvider"]
_NP_TO_ONNX = {np.dtype(np.float32): onnx.TensorProto.FLOAT, np.dtype(np.float16): onnx.TensorProto.FLOAT16,
               np.dtype(np.float64): onnx.TensorProto.DOUBLE, np.dtype(np.int64): onnx.TensorProto.INT64,
               np.dtype(np.int32): onnx.TensorProto.INT32}


class GraphBuilder:
    """Builds one graph. Float constants and inputs use ``dtype``; node names are ``name`` if given
    (``""`` leaves the node unnamed), else ``<op_type lower><k>``; a node's output is ``<name>_out``
    (or ``t<k>`` for unnamed nodes) unless ``out`` is given."""

    def __init__(self, opset: int = 17, dtype=np.float32, seed: int = 0) -> None:
        self.opset = opset
        self.dtype = np.dtype(dtype)
        self.elem = _NP_TO_ONNX[self.dtype]
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.outputs: list[str] = []
        self.feed_spec: dict[str, tuple[tuple, float, float, np.dtype]] = {}
        self.rng = np.random.default_rng(seed)
        self._k = 0

    def _fresh(self, prefix: str) -> str:
        self._k += 1
        return f"{prefix}{self._k}"

    # --- tensors -----------------------------------------------------------------------------
    def input(self, name: str, shape, low: float = -3.0, high: float = 3.0, dtype=None, feed_shape=None) -> str:
        """A graph input; symbolic dims (str) are fed as 3 unless ``feed_shape`` says otherwise."""
        dtype = np.dtype(dtype or self.dtype)
        elem = onnx.TensorProto.BOOL if dtype == np.bool_ else _NP_TO_ONNX[dtype]
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        feed_shape = feed_shape or [3 if isinstance(d, str) else d for d in shape]
        self.feed_spec[name] = (tuple(int(d) for d in feed_shape), low, high, dtype)
        return name

    def _array(self, value) -> np.ndarray:
        arr = np.asarray(value)
        if arr.dtype.kind == "f":
            arr = arr.astype(self.dtype)
        return arr

    def init(self, value, name: str | None = None) -> str:
        """An initializer (float values in the graph dtype, integer values kept)."""
        name = name or self._fresh("init")
        self.initializers.append(numpy_helper.from_array(self._array(value), name))
        return name

    def const_node(self, value, name: str | None = None) -> str:
        """A ``Constant`` node (as exporters write weights)."""
        name = name or self._fresh("cst")
        self.nodes.append(helper.make_node("Constant", [], [name], name=f"{name}_const",
                                           value=numpy_helper.from_array(self._array(value), name)))
        return name

    def const(self, value, as_node: bool = False, name: str | None = None) -> str:
        return self.const_node(value, name) if as_node else self.init(value, name)

    def weight(self, shape, scale: float = 0.5) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    # --- nodes -------------------------------------------------------------------------------
    def op(self, op_type: str, inputs, name: str | None = None, out: str | None = None, n_out: int = 1,
           **attrs) -> str | list[str]:
        if name is None:
            name = self._fresh(op_type.lower())
        if out is None:
            outs = [f"{name}_out" if name else self._fresh("t")] if n_out == 1 else [
                f"{name or self._fresh('t')}_out{i}" for i in range(n_out)]
        else:
            outs = [out] if isinstance(out, str) else list(out)
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def output(self, *names: str) -> None:
        self.outputs.extend(names)

    # --- result ------------------------------------------------------------------------------
    def build(self, graph_name: str = "g", ir_version: int | None = None, check: bool = True) -> onnx.ModelProto:
        """The model, graph outputs typed by ONNX shape inference, no intermediate value_info."""
        outs = [onnx.ValueInfoProto(name=o) for o in self.outputs]
        graph = helper.make_graph(self.nodes, graph_name, self.inputs, outs, initializer=self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name="ortfuse-pattern-tests")
        model.ir_version = ir_version or (4 if self.opset < 8 else 7 if self.opset < 13 else 8)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        del model.graph.output[:]
        model.graph.output.extend(inferred.graph.output)
        untyped = [o for o in model.graph.output if not o.type.tensor_type.HasField("shape")]
        if untyped:  # old opsets (Conv-1) lack shape inference: take the shapes from a stock run
            results = run_stock(model, self.feeds())
            for vi, value in zip(model.graph.output, results):
                if not vi.type.tensor_type.HasField("shape"):
                    vi.CopyFrom(helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, value.shape))
        if check:
            onnx.checker.check_model(model, full_check=True)
        return model

    def feeds(self, seed: int = 1) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        out = {}
        for name, (shape, low, high, dtype) in self.feed_spec.items():
            if dtype == np.bool_:
                out[name] = np.array(rng.random() < 0.5) if shape == () else rng.random(shape) < 0.5
            elif dtype.kind in "iu":
                out[name] = rng.integers(int(low) - 5, int(high) + 5, shape).astype(dtype)
            else:
                out[name] = rng.uniform(low, high, shape).astype(dtype)
        return out


def stock_options() -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return so


def run_stock(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """The reference: the (unfused) model on stock onnxruntime at ORT_DISABLE_ALL."""
    sess = ort.InferenceSession(model.SerializeToString(), stock_options(), providers=CPU)
    return sess.run(None, feeds)


def run_ortfuse(model: onnx.ModelProto, feeds: dict, **kwargs) -> tuple[list[np.ndarray], ortfuse.FusionReport]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ortfuse.InferenceSession(model.SerializeToString(), so, providers=CPU, **kwargs)
    return sess.run(None, feeds), sess.fusion_report


def fused_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The ortfuse custom-domain nodes (a fused op, or a native op inside a lowered group)."""
    return [n for n in model.graph.node if n.domain == DOMAIN]


_PROVENANCE = re.compile(r"^ortfuse (\S+): replaces (.*)$")


def fused_groups(model: onnx.ModelProto) -> dict[tuple[str, tuple[str, ...]], list[onnx.NodeProto]]:
    """Every node the rewriter wrote, by its provenance doc_string: (pattern id, replaced node names)
    -> nodes in graph order (one custom node per fused op; the ORT nodes of a lowered one)."""
    groups: dict[tuple[str, tuple[str, ...]], list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        found = _PROVENANCE.match(node.doc_string or "")
        if found:
            groups.setdefault((found.group(1), tuple(found.group(2).split(","))), []).append(node)
    return groups


def check_group(record, nodes: list[onnx.NodeProto]) -> None:
    """A fused record against the nodes carrying its provenance: one custom node named
    ``fused_node`` with the provenance attributes, or a lowered group whose output node is
    ``fused_node``, the others ``<fused_node>/<k>``, labelled in the report by its op types."""
    names = ",".join(record.nodes)
    assert all(n.doc_string == f"ortfuse {record.pattern_id}: replaces {names}" for n in nodes)
    for n in nodes:
        if n.domain == DOMAIN:
            a = node_attrs(n)
            assert (a["pattern_id"], a["replaced_nodes"]) == (record.pattern_id, names), a
    if record.kernel.startswith("lowered to ORT: "):
        ops = [n.op_type if n.domain == "" else f"{n.domain}:{n.op_type}" for n in nodes]
        assert record.kernel == "lowered to ORT: " + " + ".join(ops), (record.kernel, ops)
        read = {i for n in nodes for i in n.input}
        last = [n for n in nodes if not set(n.output) & read]
        assert [n.name for n in last] == [record.fused_node], (record.fused_node, [n.name for n in nodes])
        others = sorted((n.name for n in nodes if n is not last[0]), key=lambda s: int(s.rsplit("/", 1)[1]))
        assert others == [f"{record.fused_node}/{k}" for k in range(len(others))], others
        assert not any(n.op_type.endswith("Ref") for n in nodes)
    else:
        assert len(nodes) == 1 and nodes[0].domain == DOMAIN and nodes[0].name == record.fused_node


def node_attrs(node: onnx.NodeProto) -> dict:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


FP16_RTOL, FP16_ATOL = 4 * 2.0**-10, 2.0**-14  # 4 float16 ulps; the smallest normal float16


def tolerance(dtype, rtol: float, atol: float) -> tuple[float, float]:
    """(rtol, atol) for outputs of ``dtype``: float16 outputs get at least 4 float16 ulps, since ORT
    rounds to float16 after every op of a subgraph and a fused kernel rounds once (and ORT's own
    float16 kernels differ as much between optimization levels)."""
    if np.dtype(dtype) == np.float16:
        return max(rtol, FP16_RTOL), max(atol, FP16_ATOL)
    return rtol, atol


def assert_outputs_close(got, ref, rtol: float = 1e-4, atol: float = 1e-5, scale_atol: bool = False) -> None:
    """Same number, shapes and dtypes of outputs; float values within rtol and atol (atol times
    max(1, max|ref|) when ``scale_atol``, for folded weights; float16: ``tolerance``), integer and
    boolean values equal."""
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape, (g.shape, r.shape)
        assert g.dtype == r.dtype, (g.dtype, r.dtype)
        finite = np.abs(r[np.isfinite(r)]) if r.size else np.zeros(1)
        scale = max(1.0, float(finite.max())) if (scale_atol and finite.size) else 1.0
        if not np.issubdtype(r.dtype, np.floating):  # integers and booleans: ORT's exact values
            np.testing.assert_array_equal(g, r)
            continue
        rt, at = tolerance(r.dtype, rtol, atol)
        np.testing.assert_allclose(g, r, rtol=rt, atol=at * scale)


# --- epilogues as exporters write them ------------------------------------------------------
# Each builder takes (builder, input tensor, name prefix, as_node) and returns (output tensor,
# names of the nodes it added). ``EPILOGUES[name] = (builder, min_opset, max_opset, kind, alpha, beta)``
# where kind/alpha/beta are the fused op's ``activation``/``alpha``/``beta`` attributes.
def _scalar(b: GraphBuilder, value: float, as_node: bool) -> str:
    return b.const(np.float32(value), as_node=as_node)


def _clip(b: GraphBuilder, t: str, lo: float | None, hi: float | None, name: str, as_node: bool) -> str:
    if b.opset < 11:
        attrs = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
        return b.op("Clip", [t], name=name, **attrs)
    ins = [t, "" if lo is None else _scalar(b, lo, as_node), "" if hi is None else _scalar(b, hi, as_node)]
    while ins[-1] == "":
        ins.pop()
    return b.op("Clip", ins, name=name)


def epi_relu(b, t, p, as_node=False):
    return b.op("Relu", [t], name=f"{p}relu"), [f"{p}relu"]


def epi_clip(b, t, p, as_node=False):
    return _clip(b, t, 0.0, 6.0, f"{p}clip", as_node), [f"{p}clip"]


def epi_clip_asym(b, t, p, as_node=False):
    return _clip(b, t, -0.75, 1.25, f"{p}clip", as_node), [f"{p}clip"]


def epi_hardsigmoid(b, t, p, as_node=False):
    return b.op("HardSigmoid", [t], name=f"{p}hsig", alpha=0.25, beta=0.4), [f"{p}hsig"]


def epi_hardswish_op(b, t, p, as_node=False):
    return b.op("HardSwish", [t], name=f"{p}hswish"), [f"{p}hswish"]


def epi_hardswish_div_mul(b, t, p, as_node=False):
    """Add(x, 3) -> Clip(0, 6) -> Div(6) -> Mul(x) (torchvision's exported HardSwish)."""
    a = b.op("Add", [t, _scalar(b, 3.0, as_node)], name=f"{p}hs_add")
    c = _clip(b, a, 0.0, 6.0, f"{p}hs_clip", as_node)
    d = b.op("Div", [c, _scalar(b, 6.0, as_node)], name=f"{p}hs_div")
    return b.op("Mul", [t, d], name=f"{p}hs_mul"), [f"{p}hs_add", f"{p}hs_clip", f"{p}hs_div", f"{p}hs_mul"]


def epi_hardswish_mul_div(b, t, p, as_node=False):
    """Add(x, 3) -> Clip(0, 6) -> Mul(x) -> Div(6)."""
    a = b.op("Add", [t, _scalar(b, 3.0, as_node)], name=f"{p}hs_add")
    c = _clip(b, a, 0.0, 6.0, f"{p}hs_clip", as_node)
    m = b.op("Mul", [c, t], name=f"{p}hs_mul")
    return b.op("Div", [m, _scalar(b, 6.0, as_node)], name=f"{p}hs_div"), [
        f"{p}hs_add", f"{p}hs_clip", f"{p}hs_mul", f"{p}hs_div"]


def epi_hardsigmoid_mul(b, t, p, as_node=False):
    """x * HardSigmoid(x; 1/6, 1/2) (the HardSwish of older exporters)."""
    h = b.op("HardSigmoid", [t], name=f"{p}hs_sig", alpha=1.0 / 6.0, beta=0.5)
    return b.op("Mul", [t, h], name=f"{p}hs_mul"), [f"{p}hs_sig", f"{p}hs_mul"]


def epi_silu(b, t, p, as_node=False):
    s = b.op("Sigmoid", [t], name=f"{p}sig")
    return b.op("Mul", [t, s], name=f"{p}silu_mul"), [f"{p}sig", f"{p}silu_mul"]


def epi_gelu_op(b, t, p, as_node=False):
    return b.op("Gelu", [t], name=f"{p}gelu"), [f"{p}gelu"]


def epi_gelu_op_tanh(b, t, p, as_node=False):
    return b.op("Gelu", [t], name=f"{p}gelu", approximate="tanh"), [f"{p}gelu"]


def epi_gelu_erf_torch(b, t, p, as_node=False):
    """PyTorch: Div(x, sqrt2) -> Erf -> Add(1) -> Mul(x) -> Mul(0.5)."""
    d = b.op("Div", [t, _scalar(b, SQRT2, as_node)], name=f"{p}g_div")
    e = b.op("Erf", [d], name=f"{p}g_erf")
    one = b.op("Add", [e, _scalar(b, 1.0, as_node)], name=f"{p}g_add")
    mx = b.op("Mul", [t, one], name=f"{p}g_mulx")
    return b.op("Mul", [mx, _scalar(b, 0.5, as_node)], name=f"{p}g_half"), [
        f"{p}g_div", f"{p}g_erf", f"{p}g_add", f"{p}g_mulx", f"{p}g_half"]


def epi_gelu_erf_rsqrt2(b, t, p, as_node=False):
    """PyTorch order with Mul(x, 1/sqrt2) instead of Div(sqrt2), constants printed short."""
    d = b.op("Mul", [t, _scalar(b, 0.70710677, as_node)], name=f"{p}g_scale")
    e = b.op("Erf", [d], name=f"{p}g_erf")
    one = b.op("Add", [_scalar(b, 1.0, as_node), e], name=f"{p}g_add")
    mx = b.op("Mul", [one, t], name=f"{p}g_mulx")
    return b.op("Mul", [_scalar(b, 0.5, as_node), mx], name=f"{p}g_half"), [
        f"{p}g_scale", f"{p}g_erf", f"{p}g_add", f"{p}g_mulx", f"{p}g_half"]


def epi_gelu_erf_tf(b, t, p, as_node=False):
    """TF: h = Mul(x, 0.5) separately; Mul(x, 0.7071) -> Erf -> Add(1) -> Mul(h, .)."""
    h = b.op("Mul", [t, _scalar(b, 0.5, as_node)], name=f"{p}g_halfx")
    d = b.op("Mul", [t, _scalar(b, 0.7071067811865476, as_node)], name=f"{p}g_scale")
    e = b.op("Erf", [d], name=f"{p}g_erf")
    one = b.op("Add", [e, _scalar(b, 1.0, as_node)], name=f"{p}g_add")
    return b.op("Mul", [h, one], name=f"{p}g_mul"), [
        f"{p}g_halfx", f"{p}g_scale", f"{p}g_erf", f"{p}g_add", f"{p}g_mul"]


def epi_gelu_erf_half_first(b, t, p, as_node=False):
    """Div(sqrt2) -> Erf -> Add(1) -> Mul(0.5) -> Mul(x)."""
    d = b.op("Div", [t, _scalar(b, SQRT2, as_node)], name=f"{p}g_div")
    e = b.op("Erf", [d], name=f"{p}g_erf")
    one = b.op("Add", [e, _scalar(b, 1.0, as_node)], name=f"{p}g_add")
    h = b.op("Mul", [one, _scalar(b, 0.5, as_node)], name=f"{p}g_half")
    return b.op("Mul", [h, t], name=f"{p}g_mulx"), [f"{p}g_div", f"{p}g_erf", f"{p}g_add", f"{p}g_half", f"{p}g_mulx"]


def _gelu_tanh_tail(b, t, cube, p, as_node):
    s = b.op("Mul", [cube, _scalar(b, 0.044715, as_node)], name=f"{p}gt_scale3")
    inner = b.op("Add", [t, s], name=f"{p}gt_inner")
    k = b.op("Mul", [inner, _scalar(b, SQRT_2_OVER_PI, as_node)], name=f"{p}gt_k")
    th = b.op("Tanh", [k], name=f"{p}gt_tanh")
    one = b.op("Add", [th, _scalar(b, 1.0, as_node)], name=f"{p}gt_one")
    mx = b.op("Mul", [t, one], name=f"{p}gt_mulx")
    out = b.op("Mul", [mx, _scalar(b, 0.5, as_node)], name=f"{p}gt_half")
    return out, [f"{p}gt_scale3", f"{p}gt_inner", f"{p}gt_k", f"{p}gt_tanh", f"{p}gt_one", f"{p}gt_mulx", f"{p}gt_half"]


def epi_gelu_tanh_pow(b, t, p, as_node=False):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 Pow(x, 3))))."""
    cube = b.op("Pow", [t, _scalar(b, 3.0, as_node)], name=f"{p}gt_pow")
    out, names = _gelu_tanh_tail(b, t, cube, p, as_node)
    return out, [f"{p}gt_pow"] + names


def epi_gelu_tanh_cube(b, t, p, as_node=False):
    """The same with x^3 written x * x * x."""
    sq = b.op("Mul", [t, t], name=f"{p}gt_sq")
    cube = b.op("Mul", [sq, t], name=f"{p}gt_cube")
    out, names = _gelu_tanh_tail(b, t, cube, p, as_node)
    return out, [f"{p}gt_sq", f"{p}gt_cube"] + names


def epi_relu_gelu_op(b, t, p, as_node=False):
    r, n1 = epi_relu(b, t, p, as_node)
    out, n2 = epi_gelu_op(b, r, p, as_node)
    return out, n1 + n2


def epi_relu_gelu_erf(b, t, p, as_node=False):
    r, n1 = epi_relu(b, t, p, as_node)
    out, n2 = epi_gelu_erf_torch(b, r, p, as_node)
    return out, n1 + n2


HS = (1.0 / 6.0, 0.5)
# name: (builder, min opset, max opset, activation kind, alpha, beta)
CONV_EPILOGUES = {
    "relu": (epi_relu, 1, 99, "relu", 0.0, 0.0),
    "clip": (epi_clip, 1, 99, "clip", 0.0, 6.0),
    "clip_asym": (epi_clip_asym, 1, 99, "clip", -0.75, 1.25),
    "hardsigmoid": (epi_hardsigmoid, 1, 99, "hardsigmoid", 0.25, 0.4),
    "hardswish_op": (epi_hardswish_op, 14, 99, "hardswish", *HS),
    "hardswish_div_mul": (epi_hardswish_div_mul, 1, 99, "hardswish", *HS),
    "hardswish_mul_div": (epi_hardswish_mul_div, 1, 99, "hardswish", *HS),
    "hardsigmoid_mul": (epi_hardsigmoid_mul, 1, 99, "hardswish", *HS),
    "silu": (epi_silu, 1, 99, "silu", 0.0, 0.0),
}
GEMM_EPILOGUES = {
    "relu": (epi_relu, 1, 99, "relu", 0.0, 0.0),
    "gelu_op": (epi_gelu_op, 20, 99, "gelu", 0.0, 0.0),
    "gelu_op_tanh": (epi_gelu_op_tanh, 20, 99, "gelu_tanh", 0.0, 0.0),
    "gelu_erf_torch": (epi_gelu_erf_torch, 9, 99, "gelu", 0.0, 0.0),
    "gelu_erf_rsqrt2": (epi_gelu_erf_rsqrt2, 9, 99, "gelu", 0.0, 0.0),
    "gelu_erf_tf": (epi_gelu_erf_tf, 9, 99, "gelu", 0.0, 0.0),
    "gelu_erf_half_first": (epi_gelu_erf_half_first, 9, 99, "gelu", 0.0, 0.0),
    "gelu_tanh_pow": (epi_gelu_tanh_pow, 1, 99, "gelu_tanh", 0.0, 0.0),
    "gelu_tanh_cube": (epi_gelu_tanh_cube, 1, 99, "gelu_tanh", 0.0, 0.0),
    "relu_gelu_op": (epi_relu_gelu_op, 20, 99, "relu+gelu", 0.0, 0.0),
    "relu_gelu_erf": (epi_relu_gelu_erf, 9, 99, "relu+gelu", 0.0, 0.0),
}


def bn_params(b: GraphBuilder, m: int, as_node: bool = False) -> list[str]:
    """gamma, beta, mean, var of a BatchNormalization over m channels."""
    return [b.const(b.rng.uniform(0.5, 1.5, m), as_node), b.const(b.weight(m), as_node),
            b.const(b.weight(m), as_node), b.const(b.rng.uniform(0.5, 2.0, m), as_node)]
