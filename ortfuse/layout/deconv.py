"""Stride-2 ConvTransposes read from blocks: ORT leaves a ConvTranspose plain, behind a
``ReorderOutput``; where its kernel is 2x2 with stride 2, ortfuse's ``FusedConvTransposeS2Blocked``
reads the blocked tensor itself and folds a Relu that alone reads its output, when it measures
faster on this machine (docs/ARCHITECTURE.md §9):

    # ReorderOutput(Xb) -> x, ConvTranspose(x, w, B) -> t [-> Relu(t) -> y]
    #   ->   FusedConvTransposeS2Blocked(Xb, Wt, B; block, activation) -> y

When a second such ConvTranspose alone reads y (with a Relu or Sigmoid that alone reads its
output), it is folded in too: ``FusedConvTransposeS2x2Blocked(Xb, Wt, B, W2t, B2; block,
activation, activation2)``, the first output never written (a DB head). The ReorderOutput stays
when another op reads ``x``. A candidate has group 1, no pads, dilations,
output padding or output shape, a float32 [Cin, Cout, 2, 2] filter initializer and Cin a multiple
of the block. The decision is timed per shape as for ``winograd`` (``op_timing.native_faster``, same
``ORTFUSE_WINOGRAD`` modes: off, on, measure).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse.custom_ops.kernels.conv_filters import pack_deconv_filter
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.rulekit.checks import attr
from ortfuse.ir.editing import GraphEdit
from ortfuse.layout import op_timing, replaced_nodes
from ortfuse.layout.winograd import MARGIN, NCHWC, mode

OP = "FusedConvTransposeS2Blocked"
OP2 = "FusedConvTransposeS2x2Blocked"


@dataclass
class DeconvResult:
    replaced: int = 0
    chained: int = 0  # of them, with the next ConvTranspose folded in
    kept: int = 0

    def ops(self) -> set:
        return ({OP} if self.replaced > self.chained else set()) | ({OP2} if self.chained else set())

    def summary(self) -> str:
        if not self.replaced:
            return ""
        return (f"{self.replaced} stride-2 ConvTranspose(s) read from blocks"
                + (f", {self.chained} with the next one folded in" if self.chained else "")
                + f" ({', '.join(sorted(self.ops()))})")


def _filter(node: onnx.NodeProto, inits: dict) -> np.ndarray | None:
    """The [Cin, Cout, 2, 2] filter of a 2x2 stride-2 ConvTranspose the native kernels can run."""
    if node.op_type != "ConvTranspose" or node.domain not in ("", "ai.onnx") or node.input[1] not in inits:
        return None
    if len(node.input) > 2 and node.input[2] and node.input[2] not in inits:
        return None
    if attr(node, "group", 1) != 1 or list(attr(node, "strides", [1, 1])) != [2, 2]:
        return None
    if any(attr(node, a) is not None and any(int(v) for v in attr(node, a)) for a in ("pads", "output_padding")):
        return None
    if attr(node, "output_shape") is not None or list(attr(node, "dilations", [1, 1])) != [1, 1]:
        return None
    if attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    w = numpy_helper.to_array(inits[node.input[1]])
    if w.dtype != np.float32 or w.ndim != 4 or w.shape[2:] != (2, 2):
        return None
    return w


def _candidate(node: onnx.NodeProto, g: GraphEdit, block: int) -> np.ndarray | None:
    """The filter of a ConvTranspose that reads a ReorderOutput of blocks (Cin a multiple of block)."""
    src = g.parent(node.input[0], "ReorderOutput", NCHWC)
    if src is None or attr(src, "channels_last", 0):
        return None
    w = _filter(node, g.initializers)
    return w if w is not None and w.shape[0] % block == 0 else None


def _bias(node: onnx.NodeProto, base: str, cout: int, new_inits: list) -> str:
    if len(node.input) > 2 and node.input[2]:
        return node.input[2]
    name = f"{base}/zero_bias"
    new_inits.append(numpy_helper.from_array(np.zeros(cout, np.float32), name))
    return name


def run_deconv(graph: onnx.GraphProto, hw: dict[str, tuple[int, int]], block: int,
               decide: Callable[[int, int, int, int, str, int, str], bool]) -> DeconvResult:
    """Replace, in place, every candidate that ``decide(cin, cout, h, w, activation, cout2,
    activation2)`` accepts (cout2 0: no second ConvTranspose folded in); ``hw``: the (H, W) of
    tensors (``winograd.spatial_dims``)."""
    result = DeconvResult()
    if mode() == "off":
        return result
    g = GraphEdit(graph)
    new_inits: list[onnx.TensorProto] = []
    for node in graph.node:
        w = _candidate(node, g, block)
        if w is None:
            continue
        src = g.producer[node.input[0]]
        fold = g.child(node.output[0], "Relu")
        act = "relu" if fold is not None else ""
        mid = fold.output[0] if fold is not None else node.output[0]
        second = g.child(mid, "ConvTranspose")
        w2 = _filter(second, g.initializers) if second is not None else None
        if w2 is not None and w2.shape[0] != w.shape[1]:
            w2 = None
        fold2 = g.child(second.output[0], ("Relu", "Sigmoid")) if second is not None and w2 is not None else None
        act2 = fold2.op_type.lower() if fold2 is not None else ""
        cin, cout = w.shape[:2]
        cout2 = int(w2.shape[1]) if w2 is not None else 0
        dims = hw.get(src.input[0]) or hw.get(node.input[0])
        if dims is None or not decide(cin, cout, dims[0], dims[1], act, cout2, act2):
            result.kept += 1
            continue
        base = node.name or node.output[0]
        wt = numpy_helper.from_array(pack_deconv_filter(w), f"{base}/packed_filter")
        new_inits.append(wt)
        inputs = [src.input[0], wt.name, _bias(node, base, cout, new_inits)]
        attrs: dict = {"block": block, **({"activation": act} if act else {})}
        out = mid
        if w2 is not None and second is not None:
            base2 = second.name or second.output[0]
            wt2 = numpy_helper.from_array(pack_deconv_filter(w2), f"{base2}/packed_filter")
            new_inits.append(wt2)
            inputs += [wt2.name, _bias(second, base2, cout2, new_inits)]
            attrs.update({"activation2": act2} if act2 else {})
            out = fold2.output[0] if fold2 is not None else second.output[0]
            result.chained += 1
        new = helper.make_node(OP2 if w2 is not None else OP, inputs, [out], name=f"{base}/blocked", domain=DOMAIN,
                               **attrs)
        new.doc_string = f"ortfuse layout: {base} read from NCHWc blocks"
        chained = (second, fold2) if w2 is not None else ()
        replaced_nodes.record(new, [n for n in (node, fold, *chained) if n is not None])
        g.replace(node, new)  # the ReorderOutput before it goes too when nothing else reads its output
        g.drop(*[n for n in (fold, *chained) if n is not None])
        result.replaced += 1
    g.add_initializer(*new_inits)
    g.commit()
    return result


def _pair_models(cin: int, cout: int, h: int, w: int, block: int, act: str, cout2: int,
                 act2: str) -> tuple[bytes, bytes]:
    """ReorderInput then ReorderOutput -> ConvTranspose (-> Relu) [-> ConvTranspose (-> act2)], and
    ReorderInput -> the native op."""
    rng = np.random.default_rng(0)
    wt = (rng.standard_normal((cin, cout, 2, 2)) / np.sqrt(cin)).astype(np.float32)
    wt2 = (rng.standard_normal((cout, max(cout2, 1), 2, 2)) / np.sqrt(cout)).astype(np.float32)
    biases = [numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b"),
              numpy_helper.from_array(rng.standard_normal(max(cout2, 1)).astype(np.float32), "b2")]
    up, cy = (4, cout2) if cout2 else (2, cout)
    io = ([helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, cin, h, w])],
          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, cy, up * h, up * w])])
    first = helper.make_node("ReorderInput", ["x"], ["xb"], domain=NCHWC)
    stock = [first, helper.make_node("ReorderOutput", ["xb"], ["xp"], domain=NCHWC, channels=cin),
             helper.make_node("ConvTranspose", ["xp", "w", "b"], ["t"], strides=[2, 2])]
    last = "t"
    for op_type, kind in (("Relu", act),) + ((("ConvTranspose", "ct"), ("Relu" if act2 == "relu" else "Sigmoid", act2))
                                             if cout2 else ()):
        if not kind:
            continue
        ins = [last, "w2", "b2"] if op_type == "ConvTranspose" else [last]
        extra: dict[str, Any] = {"strides": [2, 2]} if op_type == "ConvTranspose" else {}
        stock.append(helper.make_node(op_type, ins, [f"{last}_"], **extra))
        last = f"{last}_"
    stock[-1].output[0] = "y"
    attrs: dict = {"block": block, **({"activation": act} if act else {}), **({"activation2": act2} if act2 else {})}
    native = [first, helper.make_node(OP2 if cout2 else OP, ["xb", "w", "b"] + (["w2", "b2"] if cout2 else []), ["y"],
                                      domain=DOMAIN, **attrs)]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1), helper.make_opsetid(NCHWC, 1)]
    out = []
    for nodes, packed in ((stock, False), (native, True)):
        filters = [numpy_helper.from_array(pack_deconv_filter(wt) if packed else wt, "w")]
        filters += [numpy_helper.from_array(pack_deconv_filter(wt2) if packed else wt2, "w2")] if cout2 else []
        graph = helper.make_graph(nodes, "deconv_probe", *io, filters + biases[:2 if cout2 else 1])
        out.append(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    return out[0], out[1]


@functools.lru_cache(maxsize=64)
def measured_faster(cin: int, cout: int, h: int, w: int, act: str, cout2: int, act2: str, block: int,
                    threads: int, cold: bool = False) -> bool:
    stock, native = _pair_models(cin, cout, h, w, block, act, cout2, act2)
    ops = frozenset({OP2 if cout2 else OP})
    return op_timing.native_faster(stock, native, ops, {"x": (1, cin, h, w)}, threads, MARGIN, cold=cold)


def decider(block: int, threads: int, cold: bool = False) -> Callable[[int, int, int, int, str, int, str], bool]:
    """The ``decide`` of ``run_deconv`` for this process's mode."""
    if mode() == "on":
        return lambda *shape: True
    return lambda cin, cout, h, w, act, cout2, act2: measured_faster(cin, cout, h, w, act, cout2, act2, block, threads,
                                                                     cold)
