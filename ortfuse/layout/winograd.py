"""Winograd convolutions in blocked regions: ORT's NCHWc 3x3 stride-1 Convs replaced by ortfuse's
``FusedWinogradConvBlocked`` where it measures faster on this machine (docs/ARCHITECTURE.md §9).

In the graph ORT optimized, a ``com.microsoft.nchwc:Conv`` with a 3x3 filter, stride 1, pads 1, no
dilation, one group, a blocked input (Cin and Cout multiples of the block), no fused Sum input and
no activation or ``Relu`` is a candidate; a ``QuickGelu`` that alone reads its output (as ORT makes
of Conv -> Sigmoid -> Mul, kept on blocks by ``regions``) is folded into it as the epilogue:

    # Conv_nchwc(Xb, Wb, B; activation) [-> QuickGelu(alpha)] -> Yb
    #   ->   FusedWinogradConvBlocked(Xb, U, B; block, activation, alpha) -> Yb

and an ``Add`` that alone reads the result (after the Relu or QuickGelu: a residual ORT cannot fold as
its Conv's Sum, which comes before the activation) is folded in after the epilogue; ORT runs that
Add on blocks only when its other input is blocked with the same shape:

    # Conv_nchwc(Xb, Wb, B; activation) [-> QuickGelu(alpha)] -> Add(., Rb) -> Yb
    #   ->   FusedWinogradConvAddBlocked(Xb, U, B, Rb; block, activation, alpha) -> Yb

U (the filter in the Winograd domain) is made here once from ORT's blocked filter, whose memory is
[Cout/b, Cin/b, 3, 3, b (input channel), b (output channel)].

Which form runs is decided per machine and conv shape (Cin, Cout, H, W, epilogue, residual): both are timed in
a one-conv model between reorders (``op_timing.native_faster``), at the session's thread count, and
the native form is taken only when it beats ``MARGIN`` times ORT's in every repeat (results kept
per machine, ``layout.choice_cache``).
``ORTFUSE_WINOGRAD`` = off (never) | on (always, no timing) | measure (the default). H and W are
those ``spatial_dims`` finds for the conv's input, at the dims the session serves where
``ortfuse.tune_dims`` names them (the kernel takes any H and W; only the choice is made at these);
a conv whose dims are unknown is left to ORT.
"""

from __future__ import annotations

import collections
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse.custom_ops.kernels.conv_filters import transform_filter
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.rulekit.checks import attr
from ortfuse.ir.editing import GraphEdit
from ortfuse.layout import op_timing, replaced_nodes

NCHWC = "com.microsoft.nchwc"
OP = "FusedWinogradConvBlocked"
OP_ADD = "FusedWinogradConvAddBlocked"
ENV = "ORTFUSE_WINOGRAD"
MARGIN = 0.9  # the native form must take below this share of ORT's time
QUICK_GELU_ALPHA = 1.702  # the contrib op's default alpha


@dataclass
class WinogradResult:
    replaced: collections.Counter = field(default_factory=collections.Counter)  # epilogue -> count
    kept: int = 0  # candidates left to ORT (slower here, or dims unknown)

    def ops(self) -> set:
        """The native op types the replacements use."""
        return {OP_ADD if act.endswith("+add") else OP for act in self.replaced}

    def summary(self) -> str:
        if not self.replaced:
            return ""
        parts = ", ".join(f"{n} with {act or 'no epilogue'}" for act, n in sorted(self.replaced.items()))
        ops = ", ".join(sorted(self.ops()))
        return f"{sum(self.replaced.values())} 3x3 conv(s) as Winograd F(4x4,3x3) ({ops}: {parts})" + (
            f"; {self.kept} left to ORT" if self.kept else "")


def switch(env: str, default: str = "measure") -> str:
    """An off | on | measure switch read from the environment variable ``env`` (0/false/no: off,
    1/true/yes: on), ``default`` when it is unset or empty."""
    value = os.environ.get(env, "").strip().lower()
    if not value:
        return default
    return {"0": "off", "false": "off", "no": "off", "1": "on", "true": "on", "yes": "on"}.get(value, value)


def mode() -> str:
    return switch(ENV)


def unblock_filter(wb: np.ndarray, block: int) -> np.ndarray:
    """ORT's blocked filter (memory [Cout/b, Cin/b, kh, kw, b_in, b_out]) as [Cout, Cin, kh, kw]."""
    cout, cin, kh, kw = wb.shape
    w = wb.reshape(cout // block, cin // block, kh, kw, block, block)
    return np.ascontiguousarray(w.transpose(0, 5, 1, 4, 2, 3).reshape(cout, cin, kh, kw))


def _candidate(node: onnx.NodeProto, inits: dict, block: int) -> np.ndarray | None:
    """The [Cout, Cin, 3, 3] filter of an NCHWc Conv the native kernel can run, else None."""
    if node.op_type != "Conv" or node.domain != NCHWC or len(node.input) < 2:
        return None
    if len(node.input) > 3 and node.input[3]:  # a fused Sum
        return None
    if node.input[1] not in inits or (len(node.input) > 2 and node.input[2] and node.input[2] not in inits):
        return None
    if attr(node, "group", 1) != 1 or list(attr(node, "strides", [1, 1])) != [1, 1]:
        return None
    if list(attr(node, "dilations", [1, 1])) != [1, 1] or list(attr(node, "pads", [0, 0, 0, 0])) != [1, 1, 1, 1]:
        return None
    if attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or attr(node, "activation", b"Relu") != b"Relu":
        return None
    wb = numpy_helper.to_array(inits[node.input[1]])
    if wb.dtype != np.float32 or wb.ndim != 4 or wb.shape[2:] != (3, 3):
        return None
    cout, cin = wb.shape[:2]
    if cin < block or cin % block or cout % block:
        return None
    return unblock_filter(wb, block)


def may_replace(node: onnx.NodeProto, graph: onnx.GraphProto) -> bool:
    """Whether ``node`` (in the fused model, before ORT optimizes it) is a Conv that may become a
    candidate: 3x3 filter initializer, stride 1, one group, and the mode is not off. A cheap test
    that spares models with none of them an extra optimization by ORT."""
    if node.op_type not in ("Conv", "FusedConv") or len(node.input) < 2 or mode() == "off":
        return False
    if attr(node, "group", 1) != 1 or list(attr(node, "strides", [1, 1])) != [1, 1]:
        return False
    dims = next((list(t.dims) for t in graph.initializer if t.name == node.input[1]), None)
    return dims is not None and dims[2:] == [3, 3]


def _hw(s) -> tuple[int, int] | None:
    if not s or len(s) != 4 or not all(isinstance(d, int) and d > 0 for d in s[2:]):
        return None
    return int(s[2]), int(s[3])


def spatial_dims(graph: onnx.GraphProto, shape: Callable[[str], list | None]) -> dict[str, tuple[int, int]]:
    """(H, W) of the rank-4 tensors of ORT's optimized graph, where known: those of the original
    graph by name, else carried through the graph in order: blocked convs and pools by their
    kernels, strides, pads and dilations, global pools give 1x1, Upsample multiplies by its scales,
    every other op keeps the dims of its first input with known dims. Used only to time the two
    forms at the right size: a wrong guess can cost speed, never correctness."""
    inits = {t.name: t for t in graph.initializer}
    hw: dict[str, tuple[int, int]] = {}
    for i in graph.input:
        d = _hw(shape(i.name))
        if d:
            hw[i.name] = d
    for n in graph.node:
        ins = [hw[t] for t in n.input if t in hw]
        out = None
        if ins and n.op_type in ("Conv", "MaxPool", "AveragePool") and n.domain == NCHWC:
            if n.op_type == "Conv":
                k = list(inits[n.input[1]].dims[2:]) if n.input[1] in inits else None
            else:
                k = list(attr(n, "kernel_shape", []) or [])
            if k and len(k) == 2 and n.input[0] in hw:
                h, w = hw[n.input[0]]
                st = list(attr(n, "strides", [1, 1]))
                dl = list(attr(n, "dilations", [1, 1]))
                pd = list(attr(n, "pads", [0, 0, 0, 0]))
                out = ((h + pd[0] + pd[2] - dl[0] * (k[0] - 1) - 1) // st[0] + 1,
                       (w + pd[1] + pd[3] - dl[1] * (k[1] - 1) - 1) // st[1] + 1)
        elif n.op_type in ("GlobalAveragePool", "GlobalMaxPool"):
            out = (1, 1)
        elif n.op_type == "Upsample" and n.domain == NCHWC and n.input[0] in hw:
            sc = list(attr(n, "scales", [1, 1, 1, 1]))
            out = (hw[n.input[0]][0] * int(sc[2]), hw[n.input[0]][1] * int(sc[3]))
        elif ins:
            out = ins[0]
        for o in n.output:
            d = _hw(shape(o)) or out
            if o and d:
                hw[o] = d
    return hw


def _residual(out: str, g: GraphEdit, hw: dict) -> onnx.NodeProto | None:
    """The ONNX Add that alone reads ``out`` and adds a run-time tensor of the same (H, W) to it."""
    add = g.child(out, "Add")
    if add is None or len(add.input) != 2 or add.input[0] == add.input[1]:
        return None
    other = add.input[1] if add.input[0] == out else add.input[0]
    if other in g.initializers or hw.get(other) is None or hw.get(other) != hw.get(out):
        return None
    return add


def run_winograd(graph: onnx.GraphProto, shape: Callable[[str], list | None], block: int,
                 decide: Callable[..., bool], timing: Callable[[str], list | None] | None = None) -> WinogradResult:
    """Replace, in place, every candidate conv that ``decide(cin, cout, h, w, activation, alpha,
    residual)`` accepts; returns what was done. ``timing``: the shapes at the dims the session
    serves (``ortfuse.tune_dims``), which H and W are decided at; the residual's legality is
    always proved on ``shape``, the model's own."""
    result = WinogradResult()
    if block not in (8, 16) or mode() == "off":
        return result
    g = GraphEdit(graph)
    hw = spatial_dims(graph, shape)
    sizes = spatial_dims(graph, timing) if timing is not None else hw
    new_inits: list[onnx.TensorProto] = []
    for node in graph.node:
        w = _candidate(node, g.initializers, block)
        if w is None:
            continue
        dims = sizes.get(node.input[0])
        act = "relu" if attr(node, "activation") == b"Relu" else ""
        alpha, out = 1.0, node.output[0]
        fold = None if act else g.child(out, "QuickGelu", "com.microsoft")
        if fold is not None:
            act, alpha, out = "quick_gelu", float(attr(fold, "alpha", QUICK_GELU_ALPHA)), fold.output[0]
        add = _residual(out, g, hw) if act else None
        if add is not None and g.edited(add):  # the other input's conv took it already
            add = None
        cout, cin = w.shape[:2]
        if dims is not None and add is not None and not decide(cin, cout, dims[0], dims[1], act, alpha, True):
            add = None  # the conv alone may still measure faster, the Add left to ORT
        if dims is None or (add is None and not decide(cin, cout, dims[0], dims[1], act, alpha, False)):
            result.kept += 1
            continue
        base = node.name or node.output[0]
        u = numpy_helper.from_array(transform_filter(w), f"{base}/winograd_filter")
        if len(node.input) > 2 and node.input[2]:
            bias = node.input[2]
        else:
            bias = f"{base}/winograd_bias"
            new_inits.append(numpy_helper.from_array(np.zeros(cout, np.float32), bias))
        new_inits.append(u)
        attrs: dict = {"block": block}
        if act:
            attrs["activation"] = act
        if act == "quick_gelu":
            attrs["alpha"] = alpha
        inputs = [node.input[0], u.name, bias]
        if add is not None:
            inputs.append(add.input[1] if add.input[0] == out else add.input[0])
            out = add.output[0]
        new = helper.make_node(OP_ADD if add is not None else OP, inputs, [out], name=f"{base}/winograd",
                               domain=DOMAIN, **attrs)
        new.doc_string = f"ortfuse layout: {base} as Winograd F(4x4,3x3) on NCHWc blocks"
        replaced_nodes.record(new, [n for n in (node, fold, add) if n is not None])
        g.replace(node, new)  # ORT's blocked filter goes too when nothing else reads it
        g.drop(*[n for n in (fold, add) if n is not None])
        result.replaced[act + ("+add" if add is not None else "")] += 1
    g.add_initializer(*new_inits)
    g.commit()
    return result


def _pair_models(cin: int, cout: int, h: int, w: int, block: int, act: str, alpha: float,
                 residual: bool = False) -> tuple[bytes, bytes]:
    """One conv between reorders, as ORT's blocked Conv (+QuickGelu) (+Add of a second blocked input)
    and as the native op."""
    rng = np.random.default_rng(0)
    wt = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32)
    wb = np.ascontiguousarray(wt.reshape(cout // block, block, cin // block, block, 3, 3).transpose(0, 2, 4, 5, 3, 1))
    inits = [numpy_helper.from_array(wb.reshape(cout, cin, 3, 3), "wb"),
             numpy_helper.from_array(transform_filter(wt), "u"),
             numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b")]
    ins = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, cin, h, w])]
    ins += [helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, [1, cout, h, w])] if residual else []
    io = (ins, [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, cout, h, w])])
    conv_attrs: dict[str, Any] = {"pads": [1, 1, 1, 1], **({"activation": "Relu"} if act == "relu" else {})}
    first = [helper.make_node("ReorderInput", ["x"], ["xb"], domain=NCHWC)]
    first += [helper.make_node("ReorderInput", ["r"], ["rb"], domain=NCHWC)] if residual else []
    ort_nodes = [*first, helper.make_node("Conv", ["xb", "wb", "b"], ["cb"], domain=NCHWC, **conv_attrs)]
    if act == "quick_gelu":
        ort_nodes.append(helper.make_node("QuickGelu", ["cb"], ["qb"], domain="com.microsoft", alpha=alpha))
    if residual:
        ort_nodes.append(helper.make_node("Add", [ort_nodes[-1].output[0], "rb"], ["ab"]))
    ort_nodes[-1].output[0] = "yb"
    last = helper.make_node("ReorderOutput", ["yb"], ["y"], domain=NCHWC, channels=cout)
    attrs: dict[str, Any] = {"block": block, **({"activation": act} if act else {}),
                             **({"alpha": alpha} if act == "quick_gelu" else {})}
    nat_nodes = [*first, helper.make_node(OP_ADD if residual else OP, ["xb", "u", "b"] + (["rb"] if residual else []),
                                          ["yb"], domain=DOMAIN, **attrs)]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1), helper.make_opsetid(NCHWC, 1),
              helper.make_opsetid("com.microsoft", 1)]
    out = []
    for nodes, used in ((ort_nodes, {"wb", "b"}), (nat_nodes, {"u", "b"})):
        graph = helper.make_graph([*nodes, last], "winograd_probe", *io, [t for t in inits if t.name in used])
        out.append(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    return out[0], out[1]


@functools.lru_cache(maxsize=256)
def measured_faster(cin: int, cout: int, h: int, w: int, act: str, alpha: float, block: int, threads: int,
                    residual: bool = False, cold: bool = False) -> bool:
    """Whether the native form beats MARGIN times ORT's time in every repeat on this machine, for one
    conv of this shape (with its residual Add) between reorders (``op_timing.native_faster``; ``cold``:
    timed with the caches flushed)."""
    stock, native = _pair_models(cin, cout, h, w, block, act, alpha, residual)
    feeds = {"x": (1, cin, h, w), **({"r": (1, cout, h, w)} if residual else {})}
    return op_timing.native_faster(stock, native, frozenset({OP_ADD if residual else OP}), feeds, threads, MARGIN,
                                 cold=cold)


def decider(block: int, threads: int, cold: bool = False) -> Callable[..., bool]:
    """The ``decide(cin, cout, h, w, activation, alpha, residual=False)`` of ``run_winograd`` for this
    process's mode (module docstring); ``cold``: probes timed with the caches flushed."""
    if mode() == "on":
        return lambda *shape: True
    return lambda cin, cout, h, w, act, alpha, residual=False: measured_faster(cin, cout, h, w, act, alpha, block,
                                                                              threads, residual, cold)
