"""Pointwise convolutions in blocked regions: ORT's NCHWc 1x1 Convs whose output a QuickGelu alone
reads (as ORT makes of Conv -> Sigmoid -> Mul: SiLU) replaced by ortfuse's
``FusedPointwiseConvBlocked``, which applies the QuickGelu to each tile of outputs while it is in
cache, where that measures faster on this machine (docs/ARCHITECTURE.md §9):

    # Conv_nchwc(Xb, Wb, B) -> QuickGelu(alpha) -> Yb   ->   FusedPointwiseConvBlocked(Xb, P, B; block, alpha) -> Yb
    # Concat(X0b, .., X{K-1}b; axis 1) -> Xb, Conv_nchwc(Xb, ..) -> QuickGelu(alpha) -> Yb
    #   ->   FusedPointwiseConcatConvBlocked{K}(X0b, .., X{K-1}b, P, B; block, alpha) -> Yb

A Concat that only the conv reads (YOLO's C2f and SPPF joins, a neck's join of an upsampled map with
a skip) is not copied: the native op reads its K inputs where they are (K <= MAX_INPUTS).

A candidate: a ``com.microsoft.nchwc:Conv`` with a 1x1 filter initializer, stride 1, no padding, no
dilation, one group, no activation and no fused Sum input, Cin and Cout multiples of the block (its
input blocked). ORT runs its other epilogues (Relu, Clip, HardSigmoid, HardSwish) inside its own
blocked Conv, so only the QuickGelu is a pass to save. P is made here once from ORT's blocked filter
(``kernels.pointwise_ref.pack_filter``).

Which form runs is decided per machine and conv shape (Cin, Cout, H, W, alpha, inputs joined) as for ``winograd``,
but timed on blocks without the reorders (``_pair_models``; ``op_timing.native_faster``): the native
form is taken only when it beats ``winograd.MARGIN`` times ORT's in every repeat (results kept per
machine, ``layout.choice_cache``). ``ORTFUSE_POINTWISE`` = off (never) | on (always, no timing) | measure (the
default). A conv whose input dims are unknown is left to ORT.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse.custom_ops.kernels.pointwise_ref import pack_filter
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.rulekit.checks import attr
from ortfuse.ir.editing import GraphEdit
from ortfuse.ir.links import is_op
from ortfuse.layout import op_timing, replaced_nodes, winograd
from ortfuse.layout.winograd import MARGIN, NCHWC, QUICK_GELU_ALPHA, unblock_filter

OP = "FusedPointwiseConvBlocked"  # custom_ops/native/ops/pointwise_conv.py
CONCAT_OP = "FusedPointwiseConcatConvBlocked"  # + the number of inputs, 2..MAX_INPUTS
MAX_INPUTS = 6  # pointwise_conv.MAX_INPUTS (that module compiles kernels: not imported at planning)
ENV = "ORTFUSE_POINTWISE"


@dataclass
class PointwiseResult:
    replaced: int = 0
    concats: int = 0  # of them, convs that read their Concat's inputs where they are
    kept: int = 0  # candidates left to ORT (slower here, or dims unknown)
    op_types: set = field(default_factory=set)

    def ops(self) -> set:
        return set(self.op_types)

    def summary(self) -> str:
        if not self.replaced:
            return ""
        cats = f", {self.concats} reading the inputs of the Concat before them ({CONCAT_OP}K)" if self.concats else ""
        return f"{self.replaced} 1x1 conv(s) with their QuickGelu as {OP}{cats}" + (
            f"; {self.kept} left to ORT" if self.kept else "")


def mode() -> str:
    return winograd.switch(ENV)


def _candidate(node: onnx.NodeProto, inits: dict, block: int) -> np.ndarray | None:
    """The [Cout, Cin] filter of an NCHWc 1x1 Conv the native kernel can run, else None."""
    if node.op_type != "Conv" or node.domain != NCHWC or len(node.input) < 2:
        return None
    if (len(node.input) > 3 and node.input[3]) or attr(node, "activation") is not None:
        return None
    if node.input[1] not in inits or (len(node.input) > 2 and node.input[2] and node.input[2] not in inits):
        return None
    if attr(node, "group", 1) != 1 or list(attr(node, "strides", [1, 1])) != [1, 1]:
        return None
    if list(attr(node, "dilations", [1, 1])) != [1, 1] or any(attr(node, "pads", [0, 0, 0, 0])):
        return None
    if attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    wb = numpy_helper.to_array(inits[node.input[1]])
    if wb.dtype != np.float32 or wb.ndim != 4 or wb.shape[2:] != (1, 1):
        return None
    cout, cin = wb.shape[:2]
    if cin < block or cin % block or cout % block:
        return None
    return unblock_filter(wb, block)[:, :, 0, 0]


def may_replace(node: onnx.NodeProto, graph: onnx.GraphProto) -> bool:
    """Whether ``node`` (in the fused model, before ORT optimizes it) is a Conv that may become a
    candidate: 1x1 filter initializer, stride 1, one group, and the mode is not off."""
    if node.op_type not in ("Conv", "FusedConv") or len(node.input) < 2 or mode() == "off":
        return False
    if attr(node, "group", 1) != 1 or list(attr(node, "strides", [1, 1])) != [1, 1]:
        return False
    dims = next((list(t.dims) for t in graph.initializer if t.name == node.input[1]), None)
    return dims is not None and dims[2:] == [1, 1]


def _concat_inputs(conv: onnx.NodeProto, g: GraphEdit) -> tuple[onnx.NodeProto, list[str]] | None:
    """(the Concat, its inputs) when ``conv`` reads a channel Concat of 2..MAX_INPUTS tensors that
    nothing else reads, else None. Its inputs are blocked with whole blocks of channels: the Concat
    writes the blocked tensor the conv reads, and a blocked Concat (ORT's transformer's, or a
    region's) is made only of such inputs (a padded block inside the concatenation would not be
    one)."""
    cat = g.producer.get(conv.input[0])
    if not is_op(cat, "Concat") or attr(cat, "axis") not in (1, -3) or not all(cat.input):
        return None
    if not 2 <= len(cat.input) <= MAX_INPUTS or g.only_consumer(cat.output[0]) is not conv:
        return None
    return cat, list(cat.input)


def run_pointwise(graph: onnx.GraphProto, hw: dict[str, tuple[int, int]], block: int,
                  decide: Callable[..., bool]) -> PointwiseResult:
    """Replace, in place, every candidate conv with its QuickGelu that ``decide(cin, cout, h, w,
    alpha, inputs)`` accepts (``inputs``: how many tensors a Concat before it joins, read where they
    are; 1: its own input); ``hw``: (H, W) of the graph's tensors where known
    (``winograd.spatial_dims``)."""
    result = PointwiseResult()
    if block not in (8, 16) or mode() == "off":
        return result
    g = GraphEdit(graph)
    new_inits: list[onnx.TensorProto] = []
    for node in graph.node:
        w = _candidate(node, g.initializers, block)
        if w is None:
            continue
        fold = g.child(node.output[0], "QuickGelu", "com.microsoft")
        if fold is None:
            continue
        alpha = float(attr(fold, "alpha", QUICK_GELU_ALPHA))
        dims = hw.get(node.input[0])
        cout, cin = w.shape
        joined = _concat_inputs(node, g)
        if dims is not None and joined is not None and decide(cin, cout, dims[0], dims[1], alpha, len(joined[1])):
            inputs, op, gone = joined[1], f"{CONCAT_OP}{len(joined[1])}", [joined[0]]
        elif dims is not None and decide(cin, cout, dims[0], dims[1], alpha, 1):
            inputs, op, gone = [node.input[0]], OP, []
        else:
            result.kept += 1
            continue
        base = node.name or node.output[0]
        packed = numpy_helper.from_array(pack_filter(w, block), f"{base}/pointwise_filter")
        if len(node.input) > 2 and node.input[2]:
            bias = node.input[2]
        else:
            bias = f"{base}/pointwise_bias"
            new_inits.append(numpy_helper.from_array(np.zeros(cout, np.float32), bias))
        new_inits.append(packed)
        new = helper.make_node(op, [*inputs, packed.name, bias], [fold.output[0]], name=f"{base}/pointwise",
                               domain=DOMAIN, block=block, activation="quick_gelu", alpha=alpha)
        new.doc_string = f"ortfuse layout: {base} with its QuickGelu on NCHWc blocks"
        replaced_nodes.record(new, [*gone, node, fold])
        g.replace(node, new)  # ORT's blocked filter goes too when nothing else reads it
        for n in [fold, *gone]:
            g.drop(n)
        result.replaced += 1
        result.concats += bool(gone)
        result.op_types.add(op)
    g.add_initializer(*new_inits)
    g.commit()
    return result


def parts_of(cin: int, inputs: int, block: int) -> list[int]:
    """The channels of ``inputs`` tensors a probe concatenates to ``cin``: whole blocks, as equal as
    they come (the time hardly depends on the split: the same products, another input every few
    blocks)."""
    blocks = cin // block
    return [block * (blocks // inputs + (i < blocks % inputs)) for i in range(inputs)]


def _probe_inputs(cin: int, inputs: int, block: int) -> tuple[str, dict[str, int]]:
    """The native op type of a probe of ``inputs`` joined tensors, and its inputs' channels by name."""
    names = [f"xb{i}" for i in range(inputs)] if inputs > 1 else ["xb"]
    op = f"{CONCAT_OP}{inputs}" if inputs > 1 else OP
    return op, dict(zip(names, parts_of(cin, inputs, block)))


def _pair_models(cin: int, cout: int, h: int, w: int, block: int, alpha: float,
                 inputs: int = 1) -> tuple[bytes, bytes]:
    """One 1x1 conv with its QuickGelu, as ORT's blocked Conv -> QuickGelu and as the native op,
    reading and writing blocked tensors directly (the model's own input and output: no reorders,
    as inside a region, where both forms read and write blocks; a reorder's time, the same in
    both, would only dilute the ratio); with ``inputs`` > 1, of a Concat of that many tensors
    (``parts_of``), which the native op reads where they are."""
    rng = np.random.default_rng(0)
    wt = (rng.standard_normal((cout, cin)) / np.sqrt(cin)).astype(np.float32)
    wb = np.ascontiguousarray(wt.reshape(cout // block, block, cin // block, block).transpose(0, 2, 3, 1))
    inits = [numpy_helper.from_array(wb.reshape(cout, cin, 1, 1), "wb"),
             numpy_helper.from_array(pack_filter(wt, block), "p"),
             numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b")]
    op, parts = _probe_inputs(cin, inputs, block)
    names = list(parts)
    io = ([helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, c, h, w]) for n, c in parts.items()],
          [helper.make_tensor_value_info("yb", onnx.TensorProto.FLOAT, [1, cout, h, w])])
    ort_nodes = [helper.make_node("Concat", names, ["xb"], axis=1)] if inputs > 1 else []
    ort_nodes += [helper.make_node("Conv", ["xb", "wb", "b"], ["cb"], domain=NCHWC),
                  helper.make_node("QuickGelu", ["cb"], ["yb"], domain="com.microsoft", alpha=alpha)]
    nat_nodes = [helper.make_node(op, [*names, "p", "b"], ["yb"], domain=DOMAIN, block=block,
                                  activation="quick_gelu", alpha=alpha)]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1), helper.make_opsetid(NCHWC, 1),
              helper.make_opsetid("com.microsoft", 1)]
    out = []
    for nodes, used in ((ort_nodes, {"wb", "b"}), (nat_nodes, {"p", "b"})):
        graph = helper.make_graph(nodes, "pointwise_probe", *io, [t for t in inits if t.name in used])
        out.append(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    return out[0], out[1]


@functools.lru_cache(maxsize=256)
def measured_faster(cin: int, cout: int, h: int, w: int, alpha: float, block: int, threads: int,
                    cold: bool = False, inputs: int = 1) -> bool:
    """Whether the native form beats MARGIN times ORT's time in every repeat on this machine, for one
    conv of this shape on blocks (of a Concat of ``inputs`` tensors when more than one;
    ``op_timing.native_faster``; ``cold``: caches flushed)."""
    stock, native = _pair_models(cin, cout, h, w, block, alpha, inputs)
    op, parts = _probe_inputs(cin, inputs, block)
    feeds = {n: (1, c, h, w) for n, c in parts.items()}
    return op_timing.native_faster(stock, native, frozenset({op}), feeds, threads, MARGIN, cold=cold)


def decider(block: int, threads: int, cold: bool = False) -> Callable[..., bool]:
    """The ``decide(cin, cout, h, w, alpha, inputs)`` of ``run_pointwise`` for this process's mode."""
    if mode() == "on":
        return lambda *shape: True
    return lambda cin, cout, h, w, alpha, inputs=1: measured_faster(cin, cout, h, w, alpha, block, threads, cold,
                                                                     inputs)
