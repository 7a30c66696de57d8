"""Channel padding: convolutions whose channel count is not a multiple of ORT's NCHWc block get
zero channels up to the next multiple, so that ORT runs them blocked instead of leaving them in NCHW
between reorders (docs/ARCHITECTURE.md §9).

ORT's NCHWc transformer converts a Conv only when its output channels (and, but for the first conv,
its input channels) are multiples of the block (8 with AVX2, 16 with AVX-512); the others run in
NCHW with a ReorderOutput before and a ReorderInput after. A *component* is a set of tensors of C
channels (rank 4, channels on axis 1) that are made only by ops that keep channels apart:

    producers   Conv / com.microsoft FusedConv, group 1 or depthwise (output channels padded with
                zero filters and zero bias; a FusedConv's sum input Z in the component too),
                BatchNormalization (scale and bias 0, mean 0, var 1),
                Relu, Clip, HardSigmoid, HardSwish, Sigmoid, Tanh, LeakyRelu, pools, and Add, Sub,
                Mul whose other operand is in the component or a scalar / per-channel constant
                (padded with 0), Div by a scalar or per-channel constant (padded with 1)
    readers     any of the above (they join the component); a group-1 Conv (its filter gets zero
                input channels: the padded channels add exact zeros); anything else reads a
                ``Slice`` of the first C channels.

    # Conv(X, W[C, Ci, k, k], B[C]) -> ... -> Conv(., V[Co, C, k, k])
    #   ->   Conv(X, W'[Cp, Ci, k, k], B'[Cp]) -> ... -> Conv(., V'[Co, Cp, k, k])

with Cp = C rounded up to the block, W', B' zero in the channels C..Cp, V' zero in its input
channels C..Cp. The padded channels hold act(0) of each step, finite: no op of the component makes
a non-finite value from finite ones (a divisor made in the graph could be 0 there: Div is taken only
by a constant, padded with 1), so the zero filters that read them add exact zeros (0 * inf would be
NaN); and every reader outside
the component sees exactly C channels. Sums over channels (the Convs that read the component) add
the same products plus exact zeros; ORT may sum them in another order (a different block split).

``pad_channels`` changes nothing when a component would read a tensor it cannot pad (a graph input,
a Reshape's output) or when the graph has no convolution to pad. Whether the padded graph is kept
is measured (``layout.planner``): padding costs the extra channels' work.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse.fusion.rulekit.checks import attr
from ortfuse.ir.editing import GraphEdit
from ortfuse.ir.graph import GraphIndex, fresh_name

CONVS = {("", "Conv"), ("com.microsoft", "FusedConv")}
UNARY = {"Relu", "Clip", "HardSigmoid", "HardSwish", "Sigmoid", "Tanh", "LeakyRelu", "GlobalAveragePool",
         "GlobalMaxPool", "MaxPool", "AveragePool", "Identity"}
BINARY = {"Add", "Sub", "Mul", "Div"}


@dataclass
class PaddingResult:
    components: int = 0  # groups of tensors padded
    convs: int = 0  # convolutions whose output channels were padded
    slices: int = 0  # readers outside a component given a Slice
    channels: collections.Counter = field(default_factory=collections.Counter)  # C -> tensors
    padded: dict[str, tuple[int, int]] = field(default_factory=dict)  # tensor -> (C, padded C)

    def shape_of(self, shape: Callable[[str], list | None]) -> Callable[[str], list | None]:
        """``shape`` with the padded channel count for the padded tensors."""
        def padded_shape(name: str) -> list | None:
            dims = shape(name)
            if name in self.padded and dims is not None and len(dims) == 4:
                dims = [dims[0], self.padded[name][1], *dims[2:]]
            return dims
        return padded_shape

    def summary(self) -> str:
        sizes = ", ".join(f"{c}" for c in sorted(self.channels))
        return (f"{self.convs} conv(s) padded to the block ({self.components} group(s) of {sizes} channels, "
                f"{self.slices} slice(s) where other ops read them)")


def _is_conv(node: onnx.NodeProto) -> bool:
    return (node.domain, node.op_type) in CONVS


def _sum_input(conv: onnx.NodeProto) -> list[str]:
    """[Z] of a FusedConv with a sum input (added to the output, of its shape), else []."""
    return [conv.input[3]] if len(conv.input) > 3 and conv.input[3] else []


class _Planner:
    """Finds the components of ``model`` (shapes from ``GraphIndex``) that can be padded to ``block``."""

    def __init__(self, model: onnx.ModelProto, block: int, shape: Callable[[str], list | None] | None) -> None:
        self.ix = GraphIndex(model)
        self.known = shape
        self.block = block
        self.producer = self.ix.producer
        self.outputs = self.ix.graph_outputs

    def channels(self, tensor: str) -> int | None:
        """C of a rank-4 tensor: from shape inference of this graph, else from ``shape`` (the model
        before fusion: a fused op's output keeps the name of the output it replaces)."""
        shape = self.ix.shape(tensor)
        if (shape is None or len(shape) != 4 or not isinstance(shape[1], int)) and self.known is not None:
            shape = self.known(tensor)
        if shape is None or len(shape) != 4 or not isinstance(shape[1], int):
            return None
        return shape[1]

    def weight(self, name: str) -> np.ndarray | None:
        """The float32 constant ``name`` (an initializer, or what ``GraphIndex.const`` sees through)."""
        w = self.ix.const(name) if name else None
        return w if w is not None and w.dtype == np.float32 else None

    def channel_const(self, name: str, c: int) -> np.ndarray | None:
        """The float32 initializer ``name`` when it is a scalar or holds one value per channel
        ([c, 1, 1] or [1, c, 1, 1]); None otherwise."""
        w = self.weight(name)
        if w is None:
            return None
        if w.size == 1:
            return w
        dims = list(w.shape)
        if dims in ([c, 1, 1], [1, c, 1, 1]):
            return w
        return None

    def keeps_channels(self, node: onnx.NodeProto, member: str, c: int) -> bool:
        """Whether ``node``, reading ``member`` (``c`` channels), makes a tensor of the same component:
        an op that keeps channels apart whose output has ``c`` channels, and whose other operands
        are scalar or per-channel constants or tensors of ``c`` channels (then members too)."""
        out = node.output[0] if node.output else ""
        if self.channels(out) != c or out in self.outputs:
            return False
        if self.depthwise(node, c):
            return node.input[0] == member
        if node.domain not in ("", "ai.onnx"):
            return False
        if node.op_type in UNARY:
            return node.input[0] == member and len(node.output) == 1 and all(
                not i or self.scalar(i) for i in node.input[1:])
        if node.op_type == "BatchNormalization":
            return node.input[0] == member and len(node.output) == 1 and all(
                self.weight(i) is not None for i in node.input[1:5])
        if node.op_type == "Div":  # a divisor made in the graph could hold 0 in its padded channels
            return node.input[0] == member and self.channel_const(node.input[1], c) is not None
        if node.op_type in BINARY:
            return all(i == member or self.channels(i) == c or self.channel_const(i, c) is not None
                       for i in node.input)
        return False

    def scalar(self, name: str) -> bool:
        w = self.weight(name)
        return w is not None and w.size == 1

    def depthwise(self, node: onnx.NodeProto, c: int) -> bool:
        """A conv of ``c`` groups, one filter per channel (initializers), no Sum input."""
        w = self.weight(node.input[1]) if _is_conv(node) and len(node.input) > 1 else None
        return (w is not None and attr(node, "group", 1) == c and w.ndim == 4 and w.shape[:2] == (c, 1)
                and self._bias_ok(node))

    def padable_conv(self, node: onnx.NodeProto) -> bool:
        """A group-1 conv with float32 filter (and bias) initializers; a FusedConv may have a sum input
        Z (of the output's shape: padded with it)."""
        w = self.weight(node.input[1]) if _is_conv(node) and len(node.input) > 1 else None
        return w is not None and attr(node, "group", 1) == 1 and w.ndim == 4 and self._bias_ok(node, sum_allowed=True)

    def _bias_ok(self, node: onnx.NodeProto, sum_allowed: bool = False) -> bool:
        return ((len(node.input) < 3 or not node.input[2] or self.weight(node.input[2]) is not None)
                and (len(node.input) < 4 or not node.input[3] or sum_allowed))

    def component(self, seed: str, c: int, taken: set[str]) -> set[str] | None:
        """The tensors of the component grown from ``seed``, or None when one of them is made by an op
        that cannot pad it, is a graph output or already belongs to another component."""
        inside: set[str] = set()
        todo = [seed]
        while todo:
            t = todo.pop()
            if t in inside:
                continue
            made = self.producer.get(t)
            if t in taken or t in self.outputs or self.channels(t) != c or made is None:
                return None
            inside.add(t)
            if self.padable_conv(made):  # its output channels get zero filters, its sum input Z is padded
                todo.extend(_sum_input(made))
            elif self.keeps_channels(made, made.input[0], c):
                todo.extend(i for i in made.input[:1 if made.op_type not in BINARY else 2]
                            if self.channel_const(i, c) is None)
            else:
                return None
            for reader in self.ix.consumers_of(t):
                if self.keeps_channels(reader, t, c) or (self.padable_conv(reader) and _sum_input(reader) == [t]):
                    todo.append(reader.output[0])
        return inside


def pad_channels(model: onnx.ModelProto, block: int, shape: Callable[[str], list | None] | None = None
                 ) -> tuple[onnx.ModelProto, PaddingResult]:
    """A copy of ``model`` with every paddable component's channels rounded up to ``block``, and what
    was done; ``model`` itself when nothing is padded. ``shape``: dims by tensor name where this
    graph's own shape inference has none (the model before fusion)."""
    plan = _Planner(model, block, shape)
    taken: set[str] = set()
    components = []
    for node in model.graph.node:
        if not plan.padable_conv(node):
            continue
        out = node.output[0]
        c = plan.channels(out)
        if c is None or c % block == 0 or out in taken:
            continue
        found = plan.component(out, c, taken)
        if found is None:
            continue
        taken |= found
        components.append((c, found))
    result = PaddingResult()
    if not components:
        return model, result
    padded = onnx.ModelProto()
    padded.CopyFrom(model)
    _rewrite(padded, plan, components, result)
    return padded, result


def _pad_axis(a: np.ndarray, axis: int, to: int, value: float = 0.0) -> np.ndarray:
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, to - a.shape[axis])
    return np.pad(a, widths, constant_values=value)


def _rewrite(model: onnx.ModelProto, plan: _Planner, components, result: PaddingResult) -> None:
    """Pads ``components`` (from ``plan``, an index of a graph with the same nodes and names) in
    ``model``, recorded on one ``GraphEdit``: each changed node replaced by its padded copy, each
    Slice placed after the node that makes what it reads; the filters replaced are pruned."""
    g = model.graph
    edit = GraphEdit(g)
    taken = set(edit.producer) | set(edit.initializers) | {i.name for i in g.input}
    padded: dict[str, tuple[int, int]] = {}  # tensor -> (C, Cp)
    for c, inside in components:
        cp = -(-c // plan.block) * plan.block
        padded.update(dict.fromkeys(inside, (c, cp)))
        result.components += 1
        result.channels[c] += len(inside)
    result.padded.update(padded)
    copies: dict[int, tuple[onnx.NodeProto, onnx.NodeProto]] = {}  # id(node) -> (node, its padded copy)

    def copy_of(node: onnx.NodeProto) -> onnx.NodeProto:
        if id(node) not in copies:
            new = onnx.NodeProto()
            new.CopyFrom(node)
            copies[id(node)] = (node, new)
        return copies[id(node)][1]

    def replace_init(node: onnx.NodeProto, slot: int, value: np.ndarray) -> None:
        new = copy_of(node)
        name = fresh_name(f"{node.input[slot]}_padded", taken)
        edit.add_initializer(numpy_helper.from_array(value.astype(np.float32), name))
        new.input[slot] = name

    slices: dict[str, onnx.NodeProto] = {}  # padded tensor -> the Slice of its first C channels
    for node in g.node:
        out = node.output[0] if node.output else ""
        conv1 = plan.padable_conv(node)
        member_op = out in padded and not conv1
        if conv1 and (node.input[0] in padded or out in padded):
            w = plan.weight(node.input[1])
            if node.input[0] in padded:  # zero filters for the padded input channels
                w = _pad_axis(w, 1, padded[node.input[0]][1])
            if out in padded:
                w = _pad_axis(w, 0, padded[out][1])
                if len(node.input) > 2 and node.input[2]:
                    replace_init(node, 2, _pad_axis(plan.weight(node.input[2]), 0, padded[out][1]))
                result.convs += 1
            replace_init(node, 1, w)
        for slot, t in enumerate(node.input):
            if t not in padded or member_op or (conv1 and (slot == 0 or slot == 3 and out in padded)):
                continue
            if t not in slices:  # a reader outside the component: the first C channels
                c = padded[t][0]
                name = fresh_name(f"{t}_first{c}", taken)
                starts, ends, axes = (fresh_name(f"{name}_{k}", taken) for k in ("starts", "ends", "axes"))
                edit.add_initializer(*(numpy_helper.from_array(np.array([v], np.int64), n)
                                       for v, n in ((0, starts), (c, ends), (1, axes))))
                slices[t] = helper.make_node("Slice", [t, starts, ends, axes], [name], name=name)
                result.slices += 1
            copy_of(node).input[slot] = slices[t].output[0]
        if member_op:
            c, cp = padded[out]
            if plan.depthwise(node, c):
                replace_init(node, 1, _pad_axis(plan.weight(node.input[1]), 0, cp))
                if len(node.input) > 2 and node.input[2]:
                    replace_init(node, 2, _pad_axis(plan.weight(node.input[2]), 0, cp))
                for a in copy_of(node).attribute:
                    if a.name == "group":
                        a.i = cp
                result.convs += 1
            elif node.op_type == "BatchNormalization":
                for slot, fill in ((1, 0.0), (2, 0.0), (3, 0.0), (4, 1.0)):
                    replace_init(node, slot, _pad_axis(plan.weight(node.input[slot]), 0, cp, fill))
            elif node.op_type in BINARY:
                for slot, t in enumerate(node.input):
                    const = plan.channel_const(t, c) if t not in padded else None
                    if const is not None and const.size > 1:
                        fill = 1.0 if node.op_type == "Div" and slot == 1 else 0.0
                        replace_init(node, slot, _pad_axis(const, const.ndim - 3, cp, fill))
    for t in slices:  # the node that makes a sliced tensor gets its slice placed after it
        copy_of(edit.producer[t])
    for node, new in copies.values():
        edit.replace(node, new, *(slices[o] for o in node.output if o in slices))
    edit.commit()
    for vi in [vi for vi in g.value_info if vi.name in padded]:  # their channel counts changed
        g.value_info.remove(vi)
