"""A small graph builder: unique names, scopes, and two weight styles.

``GraphBuilder(name, seed)`` stores weights as initializers;
``const_weights=True`` stores every tensor (weights and scalars) as the output of a
``Constant`` node, the way PyTorch exporters write them. Node names follow the exporter
style ``/scope/Op`` and outputs ``/scope/Op_output_0``; every name is unique.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortfuse.ir.graph import fresh_name

OPSET = 17
IR_VERSION = 8
PRODUCER = "ortfuse.models"

Shape = Sequence[int | str]


class GraphBuilder:
    """Collects nodes, inputs, outputs and weights; ``model()`` returns the ModelProto.

    ``rng`` is the seeded generator layers draw weights from; ``opset`` is the default-domain
    opset the model declares (``OPSET`` unless given).
    """

    def __init__(self, name: str, seed: int, *, const_weights: bool = False, opset: int = OPSET) -> None:
        self.name = name
        self.opset = opset
        self.const_weights = const_weights
        self.rng = np.random.default_rng(seed)
        # Extra tensors only one weight style has (conv biases) come from their own stream,
        # so the main stream, and with it every shared weight, is the same in both styles.
        self.bias_rng = np.random.default_rng([seed, 1])
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._scopes: list[str] = []
        self._used: set[str] = set()

    # -- naming ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix node names with ``name`` (``/a/b/Op``) and weight names with ``a.b.``."""
        self._scopes.append(name)
        try:
            yield
        finally:
            self._scopes.pop()

    def _unique(self, base: str) -> str:
        return fresh_name(base, self._used)

    def _node_name(self, op_type: str) -> str:
        return self._unique("/" + "/".join([*self._scopes, op_type]))

    # -- graph parts -----------------------------------------------------------------------
    def input(self, name: str, shape: Shape, dtype: int = TensorProto.FLOAT) -> str:
        """Declare a graph input of onnx elem type ``dtype`` (float32 unless given)."""
        self._used.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        return name

    def output(self, tensor: str, name: str, shape: Shape) -> str:
        """Declare ``tensor`` a float32 graph output, renamed to ``name``."""
        if name in self._used:
            raise ValueError(f"tensor name {name!r} already used")
        self._used.add(name)
        for node in self.nodes:
            for names in (node.input, node.output):
                for i, n in enumerate(names):
                    if n == tensor:
                        names[i] = name
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def op(self, op_type: str, inputs: Sequence[str], **attrs) -> str:
        """Append one node with a single output; returns the output name."""
        node_name = self._node_name(op_type)
        out = self._unique(f"{node_name}_output_0")
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=node_name, **attrs))
        return out

    def weight(self, hint: str, value: np.ndarray) -> str:
        """Add a tensor in this builder's weight style; named ``scope.hint``."""
        name = self._unique(".".join([*self._scopes, hint]))
        tensor = numpy_helper.from_array(np.array(value, order="C"), name)  # keeps 0-d scalars 0-d
        if self.const_weights:
            node_name = self._node_name("Constant")
            self.nodes.append(helper.make_node("Constant", [], [name], name=node_name, value=tensor))
        else:
            self.initializers.append(tensor)
        return name

    def scalar(self, value: float, hint: str = "const") -> str:
        """A float32 scalar (shape ``[]``) in this builder's weight style."""
        return self.weight(hint, np.array(value, dtype=np.float32))

    def ints(self, values: Sequence[int], hint: str = "shape") -> str:
        """An int64 vector (e.g. a Reshape target) in this builder's weight style."""
        return self.weight(hint, np.array(values, dtype=np.int64))

    def model(self) -> onnx.ModelProto:
        """The finished model: this builder's opset, IR version 8, fixed producer, nothing time-dependent."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", self.opset)],
            producer_name=PRODUCER,
            ir_version=IR_VERSION,
        )
        return model
