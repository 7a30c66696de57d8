"""Depthwise convolutions in blocked regions: ORT's NCHWc depthwise Convs replaced by ortfuse's
``FusedDepthwiseConvBlocked`` where it measures faster on this machine (docs/ARCHITECTURE.md §9).

In the graph ORT optimized, a ``com.microsoft.nchwc:Conv`` with group = C, a float32 [C, 1, K, K]
filter initializer (K 3 or 5), C a multiple of the block, no dilation, horizontal stride 1 or 2,
pads below K, no fused Sum input, and no activation or one of Relu, Clip, HardSigmoid, HardSwish,
Sigmoid (ORT's ``activation`` and ``activation_params``) is a candidate; a ``QuickGelu`` that alone
reads the output of one without activation (ORT's form of Conv -> Sigmoid -> Mul, SiLU, which its
blocked Conv cannot fold) is folded into it as the epilogue:

    # Conv_nchwc(Xb, Fb, B; group=C, activation) [-> QuickGelu(alpha)] -> Yb
    #   ->   FusedDepthwiseConvBlocked(Xb, Fb, B; block, strides, pads, activation, alpha, beta) -> Yb

An elementwise chain that alone feeds the conv and is an affine map of scalar constants (Mul, Add,
Sub by a one-element initializer: PP-LCNetV3's learnable affine after each activation) is folded
into it as the op's prologue, which runs in the conv's own pass over X (the padding stays zero, as
it is of the chain's output):

    # FusedEltwiseChain(Xb; x * a + b) -> Ab -> Conv_nchwc(Ab, Fb, B; ...) -> Yb
    #   ->   FusedDepthwiseConvBlocked(Xb, Fb, B; ..., in_scale=a, in_shift=b) -> Yb

Such a chain that alone reads its output, directly or through the ReorderOutput that ends the
region (PP-LCNetV3's affine after the depthwise conv's activation, before a squeeze-excite block that
runs unblocked), becomes the op's output map, one multiply-add on the outputs in registers:

    # Conv_nchwc(Xb, Fb, B; ...) -> Yb [-> ReorderOutput -> Y] -> FusedEltwiseChain(x * c + d) -> Z
    #   ->   FusedDepthwiseConvBlocked(Xb, Fb, B; ..., out_scale=c, out_shift=d) -> Zb [-> ReorderOutput -> Z]

ORT's blocked depthwise filter is already in the kernel's layout (memory [C/b, K, K, b],
``depthwise_ref.pack_filter``): the node reads the same initializer.

Which form runs is decided per machine and conv shape (C, H, W, K, strides, pads, epilogue,
prologue) as for ``winograd``: both timed in a one-conv model between reorders, the chain before
ORT's conv where there is a prologue (``op_timing.native_faster``), at the session's thread count,
the native form taken only when it beats ``winograd.MARGIN`` times ORT's in every repeat (results
kept per machine, ``layout.choice_cache``). A conv whose form with both folds is not faster is timed
again with the prologue alone, then the output map alone, then neither (a chain not folded stays a
node of its own).
``ORTFUSE_DEPTHWISE`` = off (never) | on (always, no timing) | measure; unset, the mode of the other
native convolutions (``ORTFUSE_WINOGRAD``, default measure). A conv whose input dims are unknown is
left to ORT.
"""

from __future__ import annotations

import collections
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse.custom_ops.kernels.depthwise_ref import pack_filter
from ortfuse.custom_ops.native.ops.eltwise_chain.encoding import chain_steps
from ortfuse.custom_ops.native.ops.eltwise_chain.encoding import node_attrs as chain_attrs
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.rulekit.checks import attr
from ortfuse.ir.editing import GraphEdit
from ortfuse.layout import op_timing, replaced_nodes, winograd
from ortfuse.layout.winograd import MARGIN, NCHWC, QUICK_GELU_ALPHA

OP = "FusedDepthwiseConvBlocked"
CHAIN_PREFIX = "FusedEltwiseChain"  # FusedEltwiseChain{k}: k constant operands
PROBE_CHAIN = "FusedEltwiseChain2"  # the affine chain of a timing probe (two operands)
ENV = "ORTFUSE_DEPTHWISE"
KERNELS = (3, 5)
HARD_SWISH = (1.0 / 6.0, 0.5)  # ONNX HardSwish: v * clip(v / 6 + 1/2, 0, 1)
# ORT's activation -> (the op's activation, default alpha, default beta); params override the defaults
_ACTIVATIONS = {"Relu": ("relu", 1.0, 0.0), "Clip": ("clip", float("-inf"), float("inf")),
                "HardSigmoid": ("hard_sigmoid", 0.2, 0.5), "HardSwish": ("hard_swish", *HARD_SWISH),
                "Sigmoid": ("sigmoid", 1.0, 0.0)}


@dataclass(frozen=True)
class Shape:
    """What the decision depends on: one depthwise conv and its epilogue."""

    c: int
    h: int
    w: int
    k: int
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]
    act: str = ""
    alpha: float = 1.0
    beta: float = 0.0
    in_scale: float = 1.0  # the prologue: X' = in_scale * X + in_shift
    in_shift: float = 0.0
    out_scale: float = 1.0  # the output map: out_scale * act(...) + out_shift
    out_shift: float = 0.0

    @property
    def prologue(self) -> bool:
        return (self.in_scale, self.in_shift) != (1.0, 0.0)

    @property
    def output_map(self) -> bool:
        return (self.out_scale, self.out_shift) != (1.0, 0.0)


@dataclass
class DepthwiseResult:
    replaced: collections.Counter = field(default_factory=collections.Counter)  # epilogue -> count
    kept: int = 0  # candidates left to ORT (slower here, or dims unknown)
    prologues: int = 0  # affine chains folded into the native ones before them
    output_maps: int = 0  # and after them

    def summary(self) -> str:
        if not self.replaced and not self.kept:
            return ""
        parts = ", ".join(f"{n} with {act or 'no epilogue'}" for act, n in sorted(self.replaced.items()))
        done = sum(self.replaced.values())
        folded = f", {self.prologues} with the affine chain before it as its prologue" if self.prologues else ""
        folded += f", {self.output_maps} with the affine chain after it as its output map" if self.output_maps else ""
        return (f"{done} of {done + self.kept} depthwise conv(s) native ({OP}{': ' + parts if parts else ''}"
                f"{folded}), {self.kept} left to ORT's (not faster here, or dims unknown)")


def mode() -> str:
    return winograd.switch(ENV, winograd.mode())


def _activation(node: onnx.NodeProto) -> tuple[str, float, float] | None:
    """(activation, alpha, beta) of the op for an NCHWc Conv's fused activation, None if it has none
    the op runs."""
    name = attr(node, "activation")
    if name is None:
        return "", 1.0, 0.0
    name = name.decode() if isinstance(name, bytes) else str(name)
    if name not in _ACTIVATIONS:
        return None
    act, alpha, beta = _ACTIVATIONS[name]
    params = [float(v) for v in attr(node, "activation_params", []) or []]
    if act in ("clip", "hard_sigmoid") and len(params) == 2:
        alpha, beta = params
    return act, alpha, beta


def _candidate(node: onnx.NodeProto, inits: dict, block: int) -> tuple[int, list, list, tuple] | None:
    """(K, strides, pads, activation) of an NCHWc depthwise Conv the native kernel can run, else None."""
    if node.op_type != "Conv" or node.domain != NCHWC or len(node.input) < 2:
        return None
    if len(node.input) > 3 and node.input[3]:  # a fused Sum
        return None
    if node.input[1] not in inits or (len(node.input) > 2 and node.input[2] and node.input[2] not in inits):
        return None
    if list(attr(node, "dilations", [1, 1])) != [1, 1] or attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET",
                                                                                                  "NOTSET"):
        return None
    t = inits[node.input[1]]
    dims = list(t.dims)
    if t.data_type != onnx.TensorProto.FLOAT or len(dims) != 4 or dims[1] != 1 or dims[2] != dims[3]:
        return None
    c, k = dims[0], dims[2]
    if attr(node, "group", 1) != c or k not in KERNELS or c % block:
        return None
    strides = [int(v) for v in attr(node, "strides", [1, 1])]
    pads = [int(v) for v in attr(node, "pads", [0, 0, 0, 0])]
    if len(strides) != 2 or strides[0] < 1 or strides[1] not in (1, 2) or len(pads) != 4:
        return None
    if not all(0 <= p < k for p in pads):
        return None
    act = _activation(node)
    return (k, strides, pads, act) if act is not None else None


_AFFINE_STEPS = ("Mul", "Add", "Sub")


def _affine_chain(node: onnx.NodeProto | None, inits: dict) -> tuple[float, float] | None:
    """(a, b) when ``node`` is an elementwise chain computing a * x + b with one-element float
    initializers (Mul, Add, Sub of x by a constant, in any order), else None."""
    if node is None or node.domain != DOMAIN or not node.op_type.startswith(CHAIN_PREFIX):
        return None
    if not node.op_type[len(CHAIN_PREFIX):].isdigit():  # not the blocked chain's per-channel operands
        return None
    steps = chain_steps(list(attr(node, "chain_ops", [])), list(attr(node, "chain_args", [])), list(node.input))
    if not steps:
        return None
    scale, shift = 1.0, 0.0
    for step in steps:
        if step.op not in _AFFINE_STEPS or (step.op == "Sub" and not step.x_first):
            return None
        t = inits.get(step.operand)
        if t is None or t.data_type != onnx.TensorProto.FLOAT or int(np.prod(t.dims)) != 1:
            return None
        c = float(numpy_helper.to_array(t).reshape(-1)[0])
        if step.op == "Mul":
            scale, shift = scale * c, shift * c
        else:
            shift += c if step.op == "Add" else -c
    scale, shift = float(np.float32(scale)), float(np.float32(shift))
    return (scale, shift) if np.isfinite([scale, shift]).all() else None


def _affine_after(g: GraphEdit, out: str, inits: dict) -> tuple[onnx.NodeProto, onnx.NodeProto | None,
                                                                  tuple[float, float]] | None:
    """(chain, reorder, (c, d)): the affine chain that alone reads ``out``, directly or through the
    ReorderOutput that alone reads it, else None."""
    reorder = g.child(out, "ReorderOutput", NCHWC)
    chain = g.only_consumer(reorder.output[0] if reorder is not None else out)
    if chain is None or g.edited(chain) or (reorder is not None and g.edited(reorder)):
        return None
    affine = _affine_chain(chain, inits)
    return (chain, reorder, affine) if affine is not None else None


def may_replace(node: onnx.NodeProto, graph: onnx.GraphProto) -> bool:
    """Whether ``node`` (in the fused model, before ORT optimizes it) is a Conv that may become a
    candidate: a depthwise [C, 1, K, K] filter initializer with K 3 or 5, group C, and the mode is not
    off. A cheap test that spares models with none of them an extra optimization by ORT."""
    if node.op_type not in ("Conv", "FusedConv") or len(node.input) < 2 or mode() == "off":
        return False
    dims = next((list(t.dims) for t in graph.initializer if t.name == node.input[1]), None)
    return (dims is not None and len(dims) == 4 and dims[1] == 1 and dims[2] == dims[3] and dims[2] in KERNELS
            and attr(node, "group", 1) == dims[0] > 1)


def run_depthwise(graph: onnx.GraphProto, hw: dict[str, tuple[int, int]], block: int,
                  decide: Callable[[Shape], bool]) -> DepthwiseResult:
    """Replace, in place, every candidate that ``decide(shape)`` accepts; ``hw``: the (H, W) of
    tensors (``winograd.spatial_dims``). Returns what was done."""
    result = DepthwiseResult()
    if block not in (8, 16) or mode() == "off":
        return result
    g = GraphEdit(graph)
    inits = g.initializers
    new_inits: list[onnx.TensorProto] = []
    for node in graph.node:
        found = _candidate(node, inits, block)
        if found is None:
            continue
        k, strides, pads, (act, alpha, beta) = found
        out = node.output[0]
        fold = None if act else g.child(out, "QuickGelu", "com.microsoft")
        if fold is not None:
            act, alpha, beta, out = "quick_gelu", float(attr(fold, "alpha", QUICK_GELU_ALPHA)), 0.0, fold.output[0]
        x = node.input[0]
        dims = hw.get(x)
        c = int(inits[node.input[1]].dims[0])
        shape = Shape(c, dims[0], dims[1], k, (strides[0], strides[1]), (pads[0], pads[1], pads[2], pads[3]), act,
                      alpha, beta) if dims else None
        chain = g.producer.get(x) if shape is not None and g.only_consumer(x) is node else None
        before = _affine_chain(chain, inits) if chain is not None and not g.edited(chain) else None
        after = _affine_after(g, out, inits) if shape is not None else None
        shape, chain, after = _choose_folds(shape, chain, before, after, decide)
        if shape is None:
            result.kept += 1
            continue
        if chain is not None:
            x = chain.input[0]
        base = node.name or node.output[0]
        if len(node.input) > 2 and node.input[2]:
            bias = node.input[2]
        else:
            bias = f"{base}/depthwise_bias"
            new_inits.append(numpy_helper.from_array(np.zeros(c, np.float32), bias))
        mapped, reorder = (after[0], after[1]) if after is not None else (None, None)
        if mapped is not None and reorder is None:
            out = mapped.output[0]
        new = helper.make_node(OP, [x, node.input[1], bias], [out], name=f"{base}/depthwise",
                               domain=DOMAIN, **_node_attrs(shape, block))
        new.doc_string = f"ortfuse layout: {base} as a native depthwise conv on NCHWc blocks"
        replaced_nodes.record(new, [n for n in (chain, node, fold, mapped) if n is not None])
        g.replace(node, new)
        for gone in (chain, fold, mapped):
            if gone is not None:
                g.drop(gone)
        if mapped is not None and reorder is not None:  # the reorder now writes what the chain wrote
            moved = onnx.NodeProto()
            moved.CopyFrom(reorder)
            moved.output[0] = mapped.output[0]
            g.replace(reorder, moved)
        result.replaced[act] += 1
        result.prologues += chain is not None
        result.output_maps += mapped is not None
    g.add_initializer(*new_inits)
    g.commit()
    return result


def _choose_folds(shape: Shape | None, chain: onnx.NodeProto | None, before: tuple[float, float] | None,
                  after: tuple | None, decide: Callable[[Shape], bool]):
    """(shape, chain folded before, (chain, reorder, map) folded after) of the first form ``decide``
    takes, among: both folds, the prologue alone, the output map alone, neither (each only where its
    chain is affine); (None, None, None) when ORT keeps the conv."""
    if shape is None:
        return None, None, None
    forms = []
    for pro in ([True, False] if before is not None else [False]):
        for epi in ([True, False] if after is not None else [False]):
            form = shape
            if pro and before is not None:
                form = replace(form, in_scale=before[0], in_shift=before[1])
            if epi and after is not None:
                form = replace(form, out_scale=after[2][0], out_shift=after[2][1])
            forms.append((form, chain if pro else None, after if epi else None))
    for form, folded_before, folded_after in forms:
        if decide(form):
            return form, folded_before, folded_after
    return None, None, None


def _node_attrs(s: Shape, block: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {"block": block, "strides": list(s.strides), "pads": list(s.pads)}
    if s.act:
        attrs.update(activation=s.act, alpha=s.alpha, beta=s.beta)
    if s.prologue:
        attrs.update(in_scale=s.in_scale, in_shift=s.in_shift)
    if s.output_map:
        attrs.update(out_scale=s.out_scale, out_shift=s.out_shift)
    return attrs


def _ort_conv_attrs(s: Shape) -> dict[str, Any]:
    """ORT's NCHWc Conv attributes for ``s`` (its activation fused where ORT fuses it)."""
    attrs: dict[str, Any] = {"group": s.c, "strides": list(s.strides), "pads": list(s.pads)}
    names = {v[0]: name for name, v in _ACTIVATIONS.items()}
    if s.act in names:
        attrs["activation"] = names[s.act]
        if s.act in ("clip", "hard_sigmoid"):
            attrs["activation_params"] = [s.alpha, s.beta]
    return attrs


def pair_models(s: Shape, block: int) -> tuple[bytes, bytes]:
    """One depthwise conv between reorders, as ORT's blocked Conv (+QuickGelu; after the affine
    chain ``x * in_scale + in_shift`` where ``s`` has a prologue, before ``x * out_scale + out_shift``
    where it has an output map) and as the native op."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((s.c, 1, s.k, s.k)) / s.k).astype(np.float32)
    oh = (s.h + s.pads[0] + s.pads[2] - s.k) // s.strides[0] + 1
    ow = (s.w + s.pads[1] + s.pads[3] - s.k) // s.strides[1] + 1
    inits = [numpy_helper.from_array(pack_filter(w, block), "wb"),
             numpy_helper.from_array(rng.standard_normal(s.c).astype(np.float32), "b")]
    io = ([helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, s.c, s.h, s.w])],
          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, s.c, oh, ow])])
    first = helper.make_node("ReorderInput", ["x"], ["xb"], domain=NCHWC)
    last = helper.make_node("ReorderOutput", ["yb"], ["y"], domain=NCHWC, channels=s.c)
    stock = [first, helper.make_node("Conv", ["xb", "wb", "b"], ["yb"], domain=NCHWC, **_ort_conv_attrs(s))]
    affine: list[onnx.TensorProto] = []
    program = json.dumps([{"op": "Mul", "args": ["x", "c0"]}, {"op": "Add", "args": ["x", "c1"]}])

    def probe_chain(x: str, y: str, scale: float, shift: float, prefix: str) -> onnx.NodeProto:
        affine.extend(numpy_helper.from_array(np.array([v], np.float32), f"{prefix}_{n}")
                      for n, v in (("scale", scale), ("shift", shift)))
        return helper.make_node(PROBE_CHAIN, [x, f"{prefix}_scale", f"{prefix}_shift"], [y], domain=DOMAIN,
                                program=program, **chain_attrs({"program": program}))

    if s.prologue:
        stock.insert(1, probe_chain("xb", "xa", s.in_scale, s.in_shift, "in"))
        stock[2].input[0] = "xa"
    if s.act == "quick_gelu":
        stock[-1].output[0] = "cb"
        stock.append(helper.make_node("QuickGelu", ["cb"], ["yb"], domain="com.microsoft", alpha=s.alpha))
    if s.output_map:
        stock[-1].output[0] = "eb"
        stock.append(probe_chain("eb", "yb", s.out_scale, s.out_shift, "out"))
    native = [first, helper.make_node(OP, ["xb", "wb", "b"], ["yb"], domain=DOMAIN, **_node_attrs(s, block))]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1), helper.make_opsetid(NCHWC, 1),
              helper.make_opsetid("com.microsoft", 1)]
    out = []
    for nodes, held in ((stock, inits + affine), (native, inits)):
        graph = helper.make_graph([*nodes, last], "depthwise_probe", *io, held)
        out.append(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    return out[0], out[1]


@functools.lru_cache(maxsize=256)
def measured_faster(shape: Shape, block: int, threads: int, cold: bool = False) -> bool:
    """Whether the native form beats MARGIN times ORT's time in every repeat on this machine, for one
    depthwise conv of this shape between reorders (``op_timing.native_faster``)."""
    stock, native = pair_models(shape, block)
    chains = frozenset({PROBE_CHAIN}) if shape.prologue or shape.output_map else frozenset()
    return op_timing.native_faster(stock, native, frozenset({OP}), {"x": (1, shape.c, shape.h, shape.w)}, threads,
                                 MARGIN, stock_ops=chains, cold=cold)


def decider(block: int, threads: int, cold: bool = False) -> Callable[[Shape], bool]:
    """The ``decide`` of ``run_depthwise`` for this process's mode (module docstring)."""
    if mode() == "on":
        return lambda shape: True
    return lambda shape: measured_faster(shape, block, threads, cold)
