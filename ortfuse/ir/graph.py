"""GraphIndex: read-only lookups over a model's top-level graph for the pattern matchers.

It answers what ``GraphLinks`` does (who produces a tensor, who consumes it, nodes inside
If/Loop/Scan bodies counting as consumers of the outer tensors they reference, is it a graph output,
walks along a chain of nodes) and more: is a tensor a constant (initializer, ``Constant`` node, or
``Constant -> Reshape`` / ``Constant -> Identity``), its dtype and shape from ONNX shape inference
(dims are ints, symbolic names, or None), the nodes' names and positions.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from onnx import numpy_helper

from ortfuse.ir.editing import topological_order
from ortfuse.ir.links import GraphLinks
from ortfuse.ir.links import node_inputs_with_subgraphs as node_inputs_with_subgraphs  # fusion/apply.py's

Shape = list  # of int | str | None


def fresh_name(base: str, taken: set[str]) -> str:
    """``base``, or the first free ``base_<k>`` (k = 1, 2, ...), not in ``taken``; it is added to it."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


# onnx's data propagation (shape arithmetic: Shape -> Gather -> Concat -> Reshape) keeps the values
# of a 1-D tensor it propagates as dims, tens of bytes each, so a long 1-D activation costs gigabytes
# and seconds; tensors of shape arithmetic are short (tests/test_patterns_rewrite.py checks both sides).
DATA_PROP_MAX_VECTOR = 1 << 16


def infer_shapes_with_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx shape inference with data propagation, without it when a 1-D tensor whose shape the model
    declares (an input, output or value_info) is longer than DATA_PROP_MAX_VECTOR. Declared shapes
    only: inferring first to find long vectors inside the graph would double the time of inference
    (serialising the weights dominates it on weight-heavy models). Initializers are not
    counted: a long 1-D weight (a 128K-vocabulary bias) meets activations of higher rank."""
    g = model.graph
    lengths = [vi.type.tensor_type.shape.dim[0].dim_value for vi in (*g.input, *g.output, *g.value_info)
               if vi.type.HasField("tensor_type") and len(vi.type.tensor_type.shape.dim) == 1]
    data_prop = all(n <= DATA_PROP_MAX_VECTOR for n in lengths)
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=data_prop)
    for _ in range(RANK_PASSES):
        if not _seed_reshape_ranks(inferred.graph):
            break
        try:
            inferred = onnx.shape_inference.infer_shapes(inferred, data_prop=data_prop)
        except Exception:  # noqa: BLE001 - a pass that fails keeps what the passes before it found (seeds are facts)
            break
    return inferred


# passes of inference after seeding the ranks of Reshapes: each may give the next Reshape's target a
# known length (a target built from the Shape of a tensor whose rank the previous pass found)
RANK_PASSES = 8


def _seed_reshape_ranks(graph: onnx.GraphProto) -> int:
    """Give each Reshape output that inference left without a shape the rank its target's known
    length says, every dim unknown (onnx's Reshape inference gives up on a target computed at run
    time, even of known length: its readers then lose their ranks too). Returns how many."""
    infos = {vi.name: vi for vi in (*graph.input, *graph.output, *graph.value_info)}
    lengths = {t.name: list(t.dims) for t in graph.initializer}
    for name, vi in infos.items():
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.HasField("shape"):
            lengths.setdefault(name, [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim])
    seeded = 0
    for n in graph.node:
        if n.op_type != "Reshape" or n.domain not in ("", "ai.onnx") or len(n.input) < 2:
            continue
        target, out = lengths.get(n.input[1]), n.output[0]
        if target is None or len(target) != 1 or not target[0]:
            continue
        vi = infos.get(out)
        if vi is not None and vi.type.tensor_type.HasField("shape"):
            continue
        if vi is None:
            vi = graph.value_info.add()
            vi.name = out
            infos[out] = vi
        shape = vi.type.tensor_type.shape
        for _ in range(target[0]):
            shape.dim.add()
        seeded += 1
    return seeded


class GraphIndex(GraphLinks):
    """Index of ``model.graph``; build a new one after any change to the graph.

    A matcher is given the index, or its near-miss view (``explaining()``, ``near_miss`` set), in
    which ``only_consumer`` and the walks built on it follow a tensor's first reader whatever their
    count; the view shares every table with the index, ``claimed`` and the names given out included."""

    def __init__(self, model: onnx.ModelProto, infer_shapes: bool = True) -> None:
        super().__init__(model.graph)
        self.model = model
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self.position: dict[int, int] = {id(node): pos for pos, node in enumerate(self.graph.node)}
        self.graph_inputs = {i.name for i in self.graph.input}
        self.structure_problem = _structure_problem(self.graph, self.graph_inputs | set(self.initializers))
        self._types: dict[str, tuple[int, Shape | None]] = {}
        self.shape_inference_error = ""
        self._record_types(self.graph.input, self.graph.output, self.graph.value_info)
        for t in self.graph.initializer:
            self._types[t.name] = (t.data_type, list(t.dims))
        if infer_shapes:
            try:
                inferred = infer_shapes_with_data(model)
                self._record_types(inferred.graph.value_info, inferred.graph.output)
            except Exception as exc:  # a model ORT accepts may still trip onnx's inference
                self.shape_inference_error = f"{type(exc).__name__}: {exc}"[:200]
        self.claimed: set[int] = set()  # ids of nodes already taken by a match (set by the rewriter)
        self._taken = {n.name for n in self.graph.node if n.name} | set(self._types) | set(self.producer)
        self._taken |= {i for n in self.graph.node for i in n.input}
        self._names = {}
        for i, n in enumerate(self.graph.node):
            self._names[id(n)] = n.name or self.unique_name(f"{n.op_type}_{i}")

    def unique_name(self, base: str) -> str:
        """``base``, or ``base_<k>``, not used by any node or tensor of the graph (nor given out before)."""
        return fresh_name(base, self._taken)

    def _record_types(self, *groups: Iterable[onnx.ValueInfoProto]) -> None:
        for group in groups:
            for vi in group:
                t = vi.type.tensor_type
                if not vi.type.HasField("tensor_type"):
                    continue
                shape = None
                if t.HasField("shape"):
                    shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
                self._types[vi.name] = (t.elem_type, shape)

    # --- names ---------------------------------------------------------------------------------
    def name_of(self, node: onnx.NodeProto) -> str:
        """The node's name, or ``<op_type>_<position>`` for unnamed nodes."""
        return self._names[id(node)]

    # --- constants ----------------------------------------------------------------------------
    def const(self, name: str) -> np.ndarray | None:
        """The value of a constant tensor, or None if it is computed at run time."""
        found = self.const_with_nodes(name)
        return None if found is None else found[0]

    def const_with_nodes(self, name: str) -> tuple[np.ndarray, list[onnx.NodeProto]] | None:
        """(value, nodes computing it: Constant and Reshape/Identity of constants) or None."""
        if name in self.initializers:
            if name in self.graph_inputs:  # an overridable initializer is not a constant
                return None
            tensor = self.initializers[name]
            if tensor.data_location == onnx.TensorProto.EXTERNAL and not tensor.raw_data:
                return None
            value = _tensor_value(tensor)
            return None if value is None else (value, [])
        node = self.producer.get(name)
        if node is None:
            return None
        if node.op_type == "Constant":
            value = _constant_node_value(node)
            return None if value is None else (value, [node])
        if node.op_type in ("Reshape", "Identity", "Unsqueeze", "Squeeze", "Cast") and node.input:
            data = self.const_with_nodes(node.input[0])
            if data is None:
                return None
            value, chain = data
            if node.op_type == "Identity":
                return value, chain + [node]
            if node.op_type == "Cast":
                to = next((a.i for a in node.attribute if a.name == "to"), None)
                if to is None:
                    return None
                return value.astype(onnx.helper.tensor_dtype_to_np_dtype(to)), chain + [node]
            axes_or_shape = None
            if len(node.input) > 1 and node.input[1]:
                extra = self.const_with_nodes(node.input[1])
                if extra is None:
                    return None
                axes_or_shape, more = extra
                chain = chain + more
            else:
                attr = next((a for a in node.attribute if a.name == "axes"), None)
                axes_or_shape = np.array(attr.ints) if attr is not None else None
            try:
                value = _static_shape_op(node, value, axes_or_shape)
            except Exception:
                return None
            return value, chain + [node]
        return None

    def is_scalar_const(self, name: str, expected: float, rtol: float = 1e-6) -> bool:
        """A constant of one element and rank <= 1 (a higher rank would change the output's rank)."""
        value = self.const(name)
        return bool(value is not None and value.size == 1 and value.ndim <= 1
                    and np.isclose(float(value.reshape(-1)[0]), expected, rtol=rtol, atol=0))

    # --- types --------------------------------------------------------------------------------
    def elem_type(self, name: str) -> int | None:
        return self._types.get(name, (None, None))[0]

    def shape(self, name: str) -> Shape | None:
        return self._types.get(name, (None, None))[1]

    def value_info(self, name: str) -> onnx.ValueInfoProto | None:
        if name not in self._types:
            return None
        elem, shape = self._types[name]
        return onnx.helper.make_tensor_value_info(name, elem, shape)


def _structure_problem(graph: onnx.GraphProto, sources: set[str]) -> str:
    """Why the graph is not a DAG in SSA form ("" when it is): a tensor defined twice, or a cycle.
    ORT rejects such graphs itself; matchers that walk producer/consumer links would loop on them."""
    written = set(sources)
    for node in graph.node:
        for out in node.output:
            if out and out in written:
                return f"tensor '{out}' is defined more than once"
            written.add(out)
    try:
        topological_order(list(graph.node), sources)
    except ValueError:
        return "the graph has a cycle"
    return ""


def _tensor_value(tensor: onnx.TensorProto) -> np.ndarray | None:
    """The tensor's value, or None when its data does not match its type and shape (ORT rejects
    such a model with its own error; the rewriter treats the tensor as not constant)."""
    try:
        return numpy_helper.to_array(tensor)
    except Exception:
        return None


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value":
            return _tensor_value(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
    return None  # sparse or string constants are not folded


def _static_shape_op(node: onnx.NodeProto, value: np.ndarray, arg: np.ndarray | None) -> np.ndarray:
    if node.op_type in ("Reshape", "Unsqueeze") and arg is None:
        raise ValueError(f"{node.op_type} without its shape or axes")
    if node.op_type == "Reshape" and arg is not None:
        shape = [int(s) for s in arg]
        allowzero = next((a.i for a in node.attribute if a.name == "allowzero"), 0)
        if not allowzero:
            shape = [value.shape[i] if s == 0 else s for i, s in enumerate(shape)]
        return value.reshape(shape)
    if node.op_type == "Unsqueeze" and arg is not None:
        out = value
        for axis in sorted(int(a) % (value.ndim + len(arg)) for a in arg):
            out = np.expand_dims(out, axis)
        return out
    axes = None if arg is None else tuple(int(a) for a in arg)
    return np.squeeze(value, axis=axes)
