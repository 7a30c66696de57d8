"""Squeeze-and-excitation blocks as one op: ORT's blocked SE in the graph it optimized (after the
channel scales and regions are on blocks, ``blocked_scale``, ``regions``) replaced by ortfuse's
``FusedSqueezeExciteBlocked`` where it measures faster on this machine (docs/ARCHITECTURE.md §9):

    # GlobalAveragePool_nchwc(Xb) -> P, Conv_nchwc(P, W1b, B1; act) -> Z [-> QuickGelu(alpha 1)],
    # [ReorderOutput(Z) ->] Conv_nchwc(Z, W2b, B2; HardSigmoid | Sigmoid) -> S, FusedChannelScaleBlocked(Xb, S) -> Yb
    #   ->   FusedSqueezeExciteBlocked(Xb, W1ᵀ, B1, W2ᵀ, B2; block, activation, gate, alpha, beta) -> Yb
    # ... S, FusedEltwiseChainBlocked{2,3}(Xb, S, Xb[, A]; x * S + Xb [+ A]) -> Yb
    #   ->   FusedSqueezeExcite[Add]Blocked(Xb, W1ᵀ, B1, W2ᵀ, B2[, A]; ..., residual 1) -> Yb

Every tensor between Xb and Yb must be read by the next op alone and be no graph output; FC1's
activation is none, Relu, HardSwish, Sigmoid, or SiLU (ORT's Conv then QuickGelu with alpha 1). The
1x1 weights are read back from ORT's blocked filters (``kernels.squeeze_excite.unblock_1x1``): they
hold the channels padded to the block, with zero weights, so the op runs on the padded channel count
exactly as ORT's ops do; FC1's output channels need not be a multiple of the block (a ``ReorderOutput``
ORT put there for them disappears with the block). A chain's addend A must be a blocked tensor of
X's shape (its H and W known by ``winograd.spatial_dims`` and not 1x1).

Which form runs is decided per machine and SE shape (C, Cr, H, W, activation, gate, residual,
addend, FC2 left plain): both are timed on blocked data at the session's thread count
(``op_timing.native_faster``), the native form taken only when it beats ``MARGIN`` times
ORT's in every repeat (results kept per machine, ``layout.choice_cache``).
``ORTFUSE_SE_BLOCK`` = off | on (no timing) | measure (the default).
"""

from __future__ import annotations

import collections
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse.custom_ops.kernels.squeeze_excite import block_1x1, unblock_1x1
from ortfuse.custom_ops.native.ops.eltwise_chain.encoding import chain_steps
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.fusion.rulekit.checks import attr
from ortfuse.ir.editing import GraphEdit
from ortfuse.ir.links import is_op
from ortfuse.layout import op_timing, replaced_nodes, winograd
from ortfuse.layout.winograd import spatial_dims

NCHWC = "com.microsoft.nchwc"
OP, OP_ADD = "FusedSqueezeExciteBlocked", "FusedSqueezeExciteAddBlocked"
SCALE, CHAIN = "FusedChannelScaleBlocked", "FusedEltwiseChainBlocked"
ENV = "ORTFUSE_SE_BLOCK"
MARGIN = 0.9  # the native form must take below this share of ORT's time
_ACTS = {None: "", b"Relu": "relu", b"HardSwish": "hardswish", b"Sigmoid": "sigmoid"}


@dataclass(frozen=True)
class SEShape:
    """What the decision depends on (C and Cr as the op runs them: C padded to the block)."""

    c: int
    cr: int
    h: int
    w: int
    act: str
    gate: str
    alpha: float
    beta: float
    residual: bool
    addend: bool
    plain_fc2: bool = False  # ORT left FC2 plain (its inputs off the block): FusedConv and a plain Mul


@dataclass
class SEResult:
    replaced: collections.Counter = field(default_factory=collections.Counter)  # form -> count
    kept: int = 0  # SE blocks left to ORT (slower here, or dims unknown)

    def ops(self) -> set:
        return {OP_ADD if "+ A" in form else OP for form in self.replaced}

    def summary(self) -> str:
        if not self.replaced and not self.kept:
            return ""
        parts = ", ".join(f"{n} {form}" for form, n in sorted(self.replaced.items()))
        done = f"{sum(self.replaced.values())} squeeze-excite block(s) as one op ({OP}: {parts})" if parts else ""
        left = f"{self.kept} squeeze-excite block(s) left to ORT (not faster here)" if self.kept else ""
        return "; ".join(p for p in (done, left) if p)


def mode() -> str:
    return winograd.switch(ENV)


@dataclass
class _Match:
    drop: list  # the nodes the op replaces, the scale op last
    x: str
    addend: str
    weights: tuple  # w1 [Cr, C], b1 [Cr], w2 [C, Cr], b2 [C] as float32 arrays
    shape: SEShape
    channels: int = 0  # a plain Mul's form: X's channels (the ReorderOutput of its product)


def _fc(node, inits: dict, plain: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """The 1x1 filter and the bias (zeros when absent) of an NCHWc Conv an SE may hold (``plain``: of
    ORT's plain ``FusedConv``, which holds the filter unblocked)."""
    if node is None or not (is_op(node, "FusedConv", "com.microsoft") if plain else is_op(node, "Conv", NCHWC)):
        return None
    if len(node.input) < 2 or node.input[1] not in inits:
        return None
    if (len(node.input) > 3 and node.input[3]) or attr(node, "group", 1) != 1:
        return None
    if any(list(attr(node, a, d)) != d for a, d in (("strides", [1, 1]), ("dilations", [1, 1]),
                                                     ("pads", [0, 0, 0, 0]))):
        return None
    if attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    wb = numpy_helper.to_array(inits[node.input[1]])
    if wb.dtype != np.float32 or wb.ndim != 4 or wb.shape[2:] != (1, 1):
        return None
    if len(node.input) > 2 and node.input[2]:
        if node.input[2] not in inits:
            return None
        b = numpy_helper.to_array(inits[node.input[2]]).astype(np.float32).reshape(-1)
    else:
        b = np.zeros(wb.shape[0], np.float32)
    return (wb, b) if b.shape[0] == wb.shape[0] else None


def _scale_form(node, x: str, s: str, block: int, hw: dict, inits: dict) -> tuple[bool, str] | None:
    """(residual, addend) of the op applying the gates S to X: the channel scale, or a blocked chain
    x * S [+ X] [+ A]; None for anything else."""
    if is_op(node, SCALE, DOMAIN):
        return (False, "") if list(node.input) == [x, s] and attr(node, "block") == block else None
    if not (node.domain == DOMAIN and node.op_type.startswith(CHAIN) and node.op_type[len(CHAIN):].isdigit()):
        return None
    steps = chain_steps(list(attr(node, "chain_ops", [])), list(attr(node, "chain_args", [])), list(node.input))
    if attr(node, "block") != block or steps is None or node.input[0] != x:
        return None
    if steps[0].op != "Mul" or steps[0].operand != s:
        return None
    residual, addend, k = False, "", 1
    if k < len(steps) and steps[k].op == "Add" and steps[k].operand == x:
        residual, k = True, k + 1
    if k < len(steps) and steps[k].op == "Add" and steps[k].operand not in (x, s, "") \
            and steps[k].operand not in inits:
        a = steps[k].operand
        if hw.get(a) is None or hw.get(a) != hw.get(x) or hw.get(x) == (1, 1):
            return None
        addend, k = a, k + 1
    return (residual, addend) if k == len(steps) else None


def _match(gap, g: GraphEdit, hw: dict, block: int, sizes: dict) -> _Match | None:
    """The SE starting at the blocked GlobalAveragePool ``gap``, else None. ``hw``: the (H, W) its
    legality is proved on; ``sizes``: those it is timed at."""
    inits = g.initializers
    x = gap.input[0]
    fc1 = g.only_consumer(gap.output[0])
    fc1_w = _fc(fc1, inits)
    if fc1 is None or fc1_w is None or fc1.input[0] != gap.output[0]:
        return None
    drop = [gap, fc1]
    a1 = attr(fc1, "activation")
    if a1 not in _ACTS:
        return None
    act, z = _ACTS[a1], fc1.output[0]
    nxt = g.only_consumer(z)
    if not act and is_op(nxt, "QuickGelu", "com.microsoft") and abs(float(attr(nxt, "alpha", 1.702)) - 1.0) < 1e-7:
        act, z = "silu", nxt.output[0]
        drop.append(nxt)
        nxt = g.only_consumer(z)
    plain_cr = 0
    if is_op(nxt, "ReorderOutput", NCHWC) and not attr(nxt, "channels_last", 0):
        plain_cr = int(attr(nxt, "channels", 0))
        drop.append(nxt)
        z = nxt.output[0]
        nxt = g.only_consumer(z)
    plain_fc2 = bool(plain_cr) and is_op(nxt, "FusedConv", "com.microsoft")
    fc2_w = _fc(nxt, inits, plain_fc2)
    if nxt is None or fc2_w is None or nxt.input[0] != z:
        return None
    fc2 = nxt
    drop.append(fc2)
    a2 = attr(fc2, "activation")
    if a2 == b"HardSigmoid":
        params = list(attr(fc2, "activation_params", [0.2, 0.5]))
        gate, alpha, beta = "hardsigmoid", float(params[0]), float(params[1])
    elif a2 == b"Sigmoid":
        gate, alpha, beta = "sigmoid", 0.2, 0.5
    else:
        return None
    scale = g.only_consumer(fc2.output[0])
    channels = 0
    if plain_fc2:
        form, channels = _plain_mul(scale, x, fc2.output[0], g)
    else:
        form = _scale_form(scale, x, fc2.output[0], block, hw, inits) if scale is not None else None
    if form is None or scale is None:
        return None
    drop.append(scale)
    (w1b, b1), (w2b, b2) = fc1_w, fc2_w
    c = w1b.shape[1]
    if plain_fc2 and c >= w2b.shape[0] == channels and c - channels < block:  # ORT's plain FC2: pad to C
        w2b = np.concatenate([w2b, np.zeros((c - channels,) + w2b.shape[1:], np.float32)])
        b2 = np.concatenate([b2, np.zeros(c - channels, np.float32)])
    if c % block or w1b.shape[0] % block or w2b.shape[0] != c:
        return None
    w1 = unblock_1x1(w1b, block, True)
    if plain_fc2:
        if w2b.shape[1] != plain_cr or plain_cr > w1.shape[0]:
            return None
        w2 = np.ascontiguousarray(w2b[:, :, 0, 0])
        w1, b1 = w1[:plain_cr], b1[:plain_cr]
    elif plain_cr:
        if w2b.shape[1] != plain_cr or plain_cr > w1.shape[0]:
            return None
        w2 = unblock_1x1(w2b, block, False)
        w1, b1 = w1[:plain_cr], b1[:plain_cr]
    else:
        if w2b.shape[1] != w1.shape[0]:
            return None
        w2 = unblock_1x1(w2b, block, True)
    dims = sizes.get(x)
    if dims is None:
        return None
    residual, addend = form
    shape = SEShape(c, w1.shape[0], dims[0], dims[1], act, gate, alpha, beta, residual, bool(addend), plain_fc2)
    return _Match(drop, x, addend, (w1, b1, w2, b2), shape, channels)


def _plain_mul(node, x: str, s: str, g: GraphEdit) -> tuple[tuple[bool, str] | None, int]:
    """((False, ""), channels) when ``node`` is a plain Mul of ReorderOutput(X) by S (ORT left FC2
    plain, its input channels off the block) whose product only ReorderInputs, other plain ops or the
    graph read; else (None, 0)."""
    if node is None or node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None, 0
    other = node.input[0] if node.input[1] == s else node.input[1] if node.input[0] == s else ""
    reorder = g.parent(other, "ReorderOutput", NCHWC)
    if reorder is None or attr(reorder, "channels_last", 0) or reorder.input[0] != x:
        return None, 0
    return (False, ""), int(attr(reorder, "channels", 0))


def _rewire_plain_product(mul, blocked: str, m: _Match, g: GraphEdit) -> list[onnx.NodeProto]:
    """For a plain Mul's form: the readers of its product's ReorderInputs read ``blocked`` (those
    ReorderInputs are dropped; a ReorderOutput of X the Mul alone read goes at the commit); returns the
    ReorderOutput that keeps the plain product for other readers or the graph, if any."""
    # ReorderOutput(Xb) -> x, Mul(x, S) -> y, ReorderInput(y) -> Yb   ->   op(Xb, ...) -> Yb [, ReorderOutput -> y]
    y = mul.output[0]
    keep_plain = y in g.graph_outputs
    for u in g.consumers_of(y):
        if is_op(u, "ReorderInput", NCHWC) and not attr(u, "channels_last", 0) and u.output[0] not in g.graph_outputs:
            g.rewire(u.output[0], blocked)
            g.drop(u)
        else:
            keep_plain = True
    if not keep_plain:
        return []
    return [helper.make_node("ReorderOutput", [blocked], [y], domain=NCHWC, channels=m.channels, channels_last=0,
                             name=f"{y}/reorder_output")]


def form_name(shape: SEShape) -> str:
    return "x * s" + (" + x" if shape.residual else "") + (" + A" if shape.addend else "")


def run_se_blocks(graph: onnx.GraphProto, shape: Callable[[str], list | None], block: int,
                  decide: Callable[[SEShape], bool], timing: Callable[[str], list | None] | None = None) -> SEResult:
    """Replace, in place, every SE block of ``graph`` that ``decide`` accepts; returns what was done.
    ``timing``: as ``winograd.run_winograd``'s (H and W decided at the served dims, legality on ``shape``)."""
    result = SEResult()
    if block < 1 or mode() == "off":
        return result
    g = GraphEdit(graph)
    hw = spatial_dims(graph, shape)
    sizes = spatial_dims(graph, timing) if timing is not None else hw
    new_inits: list[onnx.TensorProto] = []
    for gap in [n for n in graph.node if is_op(n, "GlobalAveragePool", NCHWC)]:
        m = _match(gap, g, hw, block, sizes)
        if m is None:
            continue
        if any(g.edited(n) for n in m.drop) or not decide(m.shape):
            result.kept += 1
            continue
        scale = m.drop[-1]
        base = gap.name or gap.output[0]
        w1, b1, w2, b2 = m.weights
        names = [f"{base}/se_w1t", f"{base}/se_b1", f"{base}/se_w2t", f"{base}/se_b2"]
        for name, value in zip(names, (w1.T, b1, w2.T, b2)):
            new_inits.append(numpy_helper.from_array(np.ascontiguousarray(value, np.float32), name))
        s = m.shape
        attrs: dict = {"block": block, "gate": s.gate, "residual": int(s.residual), "alpha": s.alpha, "beta": s.beta,
                       **({"activation": s.act} if s.act else {})}
        out = f"{scale.output[0]}/se_blocked" if m.channels else scale.output[0]
        new = helper.make_node(OP_ADD if m.addend else OP, [m.x, *names] + ([m.addend] if m.addend else []),
                               [out], name=f"{base}/squeeze_excite", domain=DOMAIN, **attrs)
        new.doc_string = f"ortfuse layout: the squeeze-excite block at {base} as one op on NCHWc blocks"
        replaced_nodes.record(new, m.drop)
        g.replace(scale, new, *(_rewire_plain_product(scale, out, m, g) if m.channels else []))
        g.drop(*m.drop[:-1])  # ORT's blocked FC filters go too when nothing else reads them
        result.replaced[form_name(s)] += 1
    g.add_initializer(*new_inits)
    g.commit()
    return result


def _pair_models(s: SEShape, block: int) -> tuple[bytes, bytes, frozenset, frozenset]:
    """ORT's SE (blocked GlobalAveragePool, two blocked Convs, the channel scale or chain; with
    ``plain_fc2``, FC2 and the Mul plain between reorders, as ORT leaves them) and the one op, on
    blocked data fed directly (the memory is what the ops read), with the ops each needs registered.
    FC1's outputs are padded to the block in ORT's form."""
    from ortfuse.custom_ops.native.ops.eltwise_chain.encoding import node_attrs

    rng = np.random.default_rng(0)
    crp = -(-s.cr // block) * block
    w1 = np.zeros((crp, s.c), np.float32)
    w1[:s.cr] = rng.standard_normal((s.cr, s.c)) / np.sqrt(s.c)
    w2 = np.zeros((s.c, crp), np.float32)
    w2[:, :s.cr] = rng.standard_normal((s.c, s.cr)) / np.sqrt(max(s.cr, 1))
    b1 = np.zeros(crp, np.float32)
    b1[:s.cr] = rng.standard_normal(s.cr)
    b2 = rng.standard_normal(s.c).astype(np.float32)
    inits = [numpy_helper.from_array(v, k) for k, v in (
        ("w1b", block_1x1(w1, block)), ("b1p", b1), ("w2b", block_1x1(w2, block)), ("b2", b2),
        ("w1t", np.ascontiguousarray(w1[:s.cr].T)), ("b1", b1[:s.cr]), ("w2t", np.ascontiguousarray(w2[:, :s.cr].T)))]
    names = ["x"] + (["a"] if s.addend else [])
    io = ([helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, s.c, s.h, s.w]) for n in names],
          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, s.c, s.h, s.w])])
    act = {"relu": "Relu", "hardswish": "HardSwish", "sigmoid": "Sigmoid"}.get(s.act)
    gate: dict[str, Any] = {"activation": "HardSigmoid", "activation_params": [s.alpha, s.beta]} \
        if s.gate == "hardsigmoid" else {"activation": "Sigmoid"}
    act_attrs: dict[str, Any] = {"activation": act} if act else {}
    ort_nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"], domain=NCHWC),
                 helper.make_node("Conv", ["p", "w1b", "b1p"], ["z"], domain=NCHWC, **act_attrs)]
    if s.act == "silu":
        ort_nodes.append(helper.make_node("QuickGelu", ["z"], ["zs"], domain="com.microsoft", alpha=1.0))
    if s.plain_fc2:  # ORT's form when FC2's inputs are off the block: FC2 and the Mul plain, between reorders
        z = ort_nodes[-1].output[0]
        ort_nodes += [helper.make_node("ReorderOutput", [z], ["zp"], domain=NCHWC, channels=s.cr),
                      helper.make_node("FusedConv", ["zp", "w2", "b2"], ["s"], domain="com.microsoft", **gate),
                      helper.make_node("ReorderOutput", ["x"], ["xp"], domain=NCHWC, channels=s.c),
                      helper.make_node("Mul", ["xp", "s"], ["m"]),
                      helper.make_node("ReorderInput", ["m"], ["y"], domain=NCHWC)]
        inits.append(numpy_helper.from_array(np.ascontiguousarray(w2[:, :s.cr]).reshape(s.c, s.cr, 1, 1), "w2"))
        scale_op = ""
    elif s.residual or s.addend:
        ort_nodes.append(helper.make_node("Conv", [ort_nodes[-1].output[0], "w2b", "b2"], ["s"], domain=NCHWC, **gate))
        program = [{"op": "Mul", "args": ["x", "c0"]}] + ([{"op": "Add", "args": ["x", "c1"]}] if s.residual else []) \
            + ([{"op": "Add", "args": ["x", f"c{1 + s.residual}"]}] if s.addend else [])
        ins = ["x", "s"] + (["x"] if s.residual else []) + (["a"] if s.addend else [])
        scale_op = f"{CHAIN}{len(ins) - 1}"
        ort_nodes.append(helper.make_node(scale_op, ins, ["y"], domain=DOMAIN, block=block,
                                          **node_attrs({"program": json.dumps(program)})))
    else:
        ort_nodes.append(helper.make_node("Conv", [ort_nodes[-1].output[0], "w2b", "b2"], ["s"], domain=NCHWC, **gate))
        scale_op = SCALE
        ort_nodes.append(helper.make_node(SCALE, ["x", "s"], ["y"], domain=DOMAIN, block=block))
    op = OP_ADD if s.addend else OP
    attrs: dict[str, Any] = {"block": block, "gate": s.gate, "residual": int(s.residual), "alpha": s.alpha,
                             "beta": s.beta, **({"activation": s.act} if s.act else {})}
    nat_nodes = [helper.make_node(op, ["x", "w1t", "b1", "w2t", "b2"] + (["a"] if s.addend else []), ["y"],
                                  domain=DOMAIN, **attrs)]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1), helper.make_opsetid(NCHWC, 1),
              helper.make_opsetid("com.microsoft", 1)]
    out = []
    for nodes in (ort_nodes, nat_nodes):
        used = {t for n in nodes for t in n.input}
        graph = helper.make_graph(nodes, "se_probe", *io, [t for t in inits if t.name in used])
        out.append(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    return out[0], out[1], frozenset({scale_op} - {""}), frozenset({op})


@functools.lru_cache(maxsize=256)
def measured_faster(s: SEShape, block: int, threads: int, cold: bool = False) -> bool:
    """Whether the native form beats MARGIN times ORT's time in every repeat for one SE of this shape on
    this machine (``op_timing.native_faster``; ORT's form holds ortfuse's channel scale or chain)."""
    stock, native, stock_ops, native_ops = _pair_models(s, block)
    feeds = dict.fromkeys(["x"] + (["a"] if s.addend else []), (1, s.c, s.h, s.w))
    return op_timing.native_faster(stock, native, native_ops, feeds, threads, MARGIN, stock_ops=stock_ops, cold=cold)


def decider(block: int, threads: int, cold: bool = False) -> Callable[[SEShape], bool]:
    """The ``decide`` of ``run_se_blocks`` for this process's mode (module docstring)."""
    if mode() == "on":
        return lambda s: True
    return lambda s: measured_faster(s, block, threads, cold)
