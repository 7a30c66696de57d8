"""Blocked regions: ops ORT left between reorder pairs, run on the NCHWc blocked tensors themselves,
in the graph ORT optimized (docs/ARCHITECTURE.md §9).

ORT's NCHWc transformer blocks the convolutions and a few ops beside them; every other op reading a
blocked tensor gets a ``ReorderOutput`` before it and a ``ReorderInput`` after it. Many such ops do
not care about the layout, provided every channel count involved is a multiple of the block ``b``
(then the blocked tensor of logical shape [N, C, H, W] holds exactly N*C*H*W values, memory
[N, C/b, H, W, b], and no padded lane exists):

    # ReorderOutput(Xb) -> x, op(x, ...) -> y, ReorderInput(y) -> Yb   ->   op(Xb, ...) -> Yb

* elementwise ops, ortfuse's native ones and ONNX's (one output element from the same element of
  each input): every input has the output's shape or one element;
* ``Concat`` and ``Split`` on the channel axis: on [N, C, H, W] with memory [N, C/b, H, W, b] they
  are the same copy of per-image runs of C*H*W values, whatever the layout;
* ``Resize`` (nearest, asymmetric, floor, constant integer scales on H and W) becomes ORT's blocked
  ``com.microsoft.nchwc:Upsample``, which ORT's own transformer makes of such a Resize;
* ``GlobalAveragePool`` and ``GlobalMaxPool`` become ORT's blocked ones, which its transformer makes
  only of a pool whose input a blocked op wrote (not of one after ortfuse's elementwise op);
* a squeeze-excite scale ``x * s`` (x [N, C, H, W], s [N, C, 1, 1]) becomes ortfuse's
  ``FusedChannelScaleBlocked`` (``blocked_scale``), where both were moved onto blocks.

Ops that qualify are grouped into regions (connected through the tensors they share, a reorder's
output read by several of them included); a region is rewritten only when it removes more reorders
than it adds (a ``ReorderOutput`` for each of its outputs that a plain op or the graph still reads).
``shape`` gives a tensor's dims in the graph before ORT optimized it (tensors around reorders keep
their names); a ``ReorderOutput``'s output whose dims shape inference lost (after a Reshape of
computed shape) has rank 4 and the reorder's channel count, its other dims a symbol of that tensor
alone, equal to no other tensor's. The graph is rewritten in place and left in topological order.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx
from onnx import helper, numpy_helper

from ortfuse.custom_ops.specs import DOMAIN, MAX_CHAIN_OPERANDS
from ortfuse.fusion.rulekit.checks import attr
from ortfuse.ir.editing import GraphEdit
from ortfuse.ir.links import GraphLinks
from ortfuse.layout.blocked_scale import OP as SCALE
from ortfuse.layout.blocked_scale import scale_shapes

NCHWC = "com.microsoft.nchwc"
CHAIN, BLOCKED_CHAIN = "FusedEltwiseChain", "FusedEltwiseChainBlocked"
# one output element from the same element of every input (numpy broadcasting), float32 in and out
ELEMENTWISE = frozenset(
    {("", op) for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Relu", "Sigmoid", "Tanh", "Clip",
                         "HardSigmoid", "HardSwish", "LeakyRelu", "Neg", "Abs", "Exp", "Softplus", "Erf", "Sqrt",
                         "Elu", "Selu", "Identity")}
    | {("com.microsoft", "QuickGelu")}
    | {(DOMAIN, op) for op in ("FusedSiLU", "FusedHardSwish", "FusedMish", "FusedAddRelu")}
    | {(DOMAIN, f"FusedEltwiseChain{k}") for k in range(MAX_CHAIN_OPERANDS + 1)}
)


@dataclass
class RegionResult:
    regions: int = 0  # regions rewritten
    native_ops: set = field(default_factory=set)  # ortfuse's blocked ops the regions added
    moved: collections.Counter = field(default_factory=collections.Counter)  # op type -> count run blocked
    kept: int = 0  # regions left as ORT made them (they would not remove reorders)

    def summary(self) -> str:
        ops = ", ".join(f"{n} {op}" for op, n in sorted(self.moved.items(), key=lambda kv: (-kv[1], kv[0])))
        return f"{self.regions} region(s) of ops run blocked ({ops})" if self.regions else ""


def may_move(node: onnx.NodeProto) -> bool:
    """Whether ``node`` (in the fused model, before ORT optimizes it) is of a type a region may run
    blocked and ORT's own NCHWc transformer does not: ortfuse's elementwise ops, Split, Concat, Resize.
    A cheap test that spares models with none of them an extra optimization by ORT."""
    key = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
    return (key[0] == DOMAIN and key in ELEMENTWISE) or key in {("", "Split"), ("", "Concat"), ("", "Resize")}


def _is_plain_reorder(node: onnx.NodeProto, op_type: str) -> bool:
    return node.op_type == op_type and node.domain == NCHWC and not attr(node, "channels_last", 0)


def reorders_left(graph: onnx.GraphProto, block: int = 0) -> collections.Counter:
    """The plain op on the other side of each reorder left (its op type; 'graph input/output'): where
    a region meets an op nothing runs blocked. With ``block``, a ReorderOutput of a channel count off
    the block names it ("Op (20 channels, not a multiple of the block 8)"): ORT pads such tensors, and
    the ops that run blocked here need every channel real."""
    links = GraphLinks(graph)
    left: collections.Counter = collections.Counter()
    for n in graph.node:
        if _is_plain_reorder(n, "ReorderInput"):
            p = links.producer.get(n.input[0])
            left[p.op_type if p is not None else "graph input"] += 1
        elif _is_plain_reorder(n, "ReorderOutput"):
            users = links.consumers_of(n.output[0])
            c = int(attr(n, "channels", 0) or 0)
            why = f" ({c} channels, not a multiple of the block {block})" if block and c % block else ""
            for u in sorted({u.op_type for u in users}) or []:
                left[u + why] += 1
            if n.output[0] in links.graph_outputs:
                left["graph output"] += 1
    return left


class _Graph(GraphEdit):
    """The graph being edited and the blocked twin of each plain tensor known so far."""

    def __init__(self, graph: onnx.GraphProto, shape: Callable[[str], list | None], block: int):
        super().__init__(graph)
        self.shape, self.block = shape, block
        self.twin: dict[str, str] = {}  # plain tensor -> blocked tensor with the same values
        self.channels: dict[str, int] = {}
        self.known: dict[str, list] = {}  # dims of planned nodes' outputs
        for n in graph.node:
            if _is_plain_reorder(n, "ReorderOutput"):
                c = attr(n, "channels")
                if c is not None and int(c) % block == 0:
                    self.twin[n.output[0]], self.channels[n.output[0]] = n.input[0], int(c)
                    if self.dims(n.output[0]) is None:
                        self.known[n.output[0]] = _own_symbols(n.output[0], shape(n.output[0]), int(c))
            elif _is_plain_reorder(n, "ReorderInput"):
                c = self.dims(n.input[0])
                if c is not None and c[1] % block == 0:
                    self.twin.setdefault(n.input[0], n.output[0])
                    self.channels[n.input[0]] = c[1]

    def dims(self, name: str) -> list | None:
        """Rank-4 dims with an int channel count and no unknown dim, else None: those a planned
        node's inputs give its output, else those of ``shape``."""
        s = self.known.get(name) or self.shape(name)
        if not s or len(s) != 4 or not isinstance(s[1], int) or any(d is None for d in s):
            return None
        return list(s)

    def scalar(self, name: str) -> bool:
        if name in self.initializers:
            dims = self.initializers[name].dims
            return all(d == 1 for d in dims)
        s = self.shape(name)
        return s is not None and all(d == 1 for d in s)

    def const(self, name: str):
        return numpy_helper.to_array(self.initializers[name]) if name in self.initializers else None


def _own_symbols(name: str, dims: list | None, channels: int) -> list:
    """Rank-4 dims of the plain tensor ``name`` with ``channels``: the known ones kept, each other a
    symbol naming this tensor and axis."""
    dims = list(dims) if dims is not None and len(dims) == 4 else [None] * 4
    dims[1] = channels
    return [f"?{name}:{axis}" if d is None else d for axis, d in enumerate(dims)]


def _blocked_node(node: onnx.NodeProto, g: _Graph) -> tuple[onnx.NodeProto, list[tuple[str, list]]] | None:
    """The node running ``node`` on blocked tensors and its plain outputs with their dims (derived
    from the inputs'), or None where it cannot."""
    key = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
    if key in ELEMENTWISE:
        return _elementwise(node, g) or (_channel_scale(node, g) if key == ("", "Mul") else None)
    if key in (("", "GlobalAveragePool"), ("", "GlobalMaxPool")):
        return _global_pool(node, g)
    if key == ("", "Concat"):
        return _concat(node, g)
    if key == ("", "Split"):
        return _split(node, g)
    if key == ("", "Resize"):
        return _resize(node, g)
    return None


def _copy(node: onnx.NodeProto, inputs: list[str], op_type: str | None = None, domain: str | None = None,
          attrs: dict | None = None) -> onnx.NodeProto:
    new = helper.make_node(op_type or node.op_type, inputs, [f"{o}/blocked" if o else "" for o in node.output],
                           name=f"{node.name or node.output[0]}/blocked",
                           domain=node.domain if domain is None else domain, **(attrs or {}))
    if attrs is None:
        new.attribute.extend(node.attribute)
    new.doc_string = f"ortfuse layout: {node.name or node.output[0]} on NCHWc blocks"
    return new


def _elementwise(node, g):
    """Every input of one shape (a blocked twin) or one element; a chain's operands may also hold one
    value per channel ([N or 1, C, 1, 1], [C, 1, 1]): it becomes ``FusedEltwiseChainBlocked``."""
    if len(node.output) != 1:
        return None
    chain = node.domain == DOMAIN and node.op_type.startswith(CHAIN)
    full = [g.dims(t) for t in node.input if t and t in g.twin]
    out = full[0] if full else None
    if out is None or out[1] % g.block:
        return None
    inputs, per_channel = [], False
    for i, t in enumerate(node.input):
        if t and t in g.twin and _same(g.dims(t), out):
            inputs.append(g.twin[t])
        elif not t or g.scalar(t):
            inputs.append(t)
        elif chain and i > 0 and _per_channel(g, t, out):
            inputs.append(g.twin.get(t, t))  # [N, C, 1, 1]: the blocked and plain memory are the same
            per_channel = True
        else:
            return None
    if per_channel:  # the blocked chain kernel walks X: it must have the output's shape
        if node.input[0] not in g.twin or not _same(g.dims(node.input[0]), out):
            return None
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs["block"] = g.block
        return _copy(node, inputs, BLOCKED_CHAIN + node.op_type[len(CHAIN):], DOMAIN, attrs), [(node.output[0], out)]
    return _copy(node, inputs), [(node.output[0], out)]


def _channel_scale(node, g):
    """x [N, C, H, W] * s [N, C, 1, 1], both with blocked twins: ``FusedChannelScaleBlocked(Xb, Sb)``."""
    which = scale_shapes(node, g.dims) if all(t in g.twin for t in node.input) else 0
    if not which:
        return None
    x, s = node.input if which == 1 else reversed(node.input)
    dx, ds = g.dims(x), g.dims(s)
    if dx is None or ds is None or dx[:2] != ds[:2] or dx[1] % g.block:
        return None
    return _copy(node, [g.twin[x], g.twin[s]], SCALE, DOMAIN, {"block": g.block}), [(node.output[0], dx)]


def _global_pool(node, g):
    """A global pool of a blocked tensor: ORT's blocked pool, output [N, C, 1, 1]."""
    x = node.input[0]
    d = g.dims(x)
    if x not in g.twin or d is None or len(node.output) != 1:
        return None
    return _copy(node, [g.twin[x]], node.op_type, NCHWC, {}), [(node.output[0], d[:2] + [1, 1])]


def _same(a: list | None, b: list) -> bool:
    """One [C, H, W] (same channel count, same H and W, each an int or one symbol). The batch may
    differ: it is the outermost dim in both layouts, so its broadcast is the same on blocks."""
    return a is not None and a[1:] == b[1:]


def _per_channel(g: _Graph, name: str, out: list) -> bool:
    s = list(g.initializers[name].dims) if name in g.initializers else g.shape(name)
    if s is None:
        return False
    return (len(s) == 4 and s[1:] == [out[1], 1, 1]) or s == [out[1], 1, 1]


def _channel_axis(node) -> bool:
    return attr(node, "axis", 0) in (1, -3)


def _concat(node, g):
    dims = [g.dims(t) for t in node.input]
    if not _channel_axis(node) or not dims or any(d is None for d in dims):
        return None
    first = dims[0]  # a valid Concat has one batch, H and W: only the channels need checking
    for t, d in zip(node.input, dims):
        if t not in g.twin or d[1] % g.block:
            return None
    out = [first[0], sum(d[1] for d in dims)] + first[2:]
    return _copy(node, [g.twin[t] for t in node.input]), [(node.output[0], out)]


def _split(node, g):
    x = node.input[0]
    d = g.dims(x)
    if x not in g.twin or d is None or not _channel_axis(node) or not all(node.output):
        return None
    if len(node.input) > 1 and node.input[1]:
        sizes = g.const(node.input[1])
        if sizes is None:
            return None
        sizes = [int(s) for s in sizes.reshape(-1)]
    elif attr(node, "split") is not None:
        sizes = [int(s) for s in attr(node, "split")]
    else:
        if d[1] % len(node.output):
            return None
        sizes = [d[1] // len(node.output)] * len(node.output)
    if len(sizes) != len(node.output) or sum(sizes) != d[1] or any(s % g.block for s in sizes):
        return None
    outs = [(o, [d[0], s] + d[2:]) for o, s in zip(node.output, sizes)]
    return _copy(node, [g.twin[x]] + list(node.input[1:])), outs


def _resize(node, g):
    """Nearest, asymmetric, floor, constant integer scales on H and W: ORT's blocked Upsample."""
    x = node.input[0]
    d = g.dims(x)
    if x not in g.twin or d is None or len(node.input) < 3 or (len(node.input) > 3 and node.input[3]):
        return None
    mode = attr(node, "mode", b"nearest")
    ctm = attr(node, "coordinate_transformation_mode", b"half_pixel")
    nearest = attr(node, "nearest_mode", b"round_prefer_floor")
    if (mode, ctm, nearest) != (b"nearest", b"asymmetric", b"floor"):
        return None
    scales = g.const(node.input[2])
    if scales is None or scales.shape != (4,):
        return None
    ints = [int(s) for s in scales]
    if ints[:2] != [1, 1] or any(s < 1 or s != float(f) for s, f in zip(ints, scales)):
        return None
    out = d[:2] + [v * s if isinstance(v, int) else None for v, s in zip(d[2:], ints[2:])]
    if None in out:
        return None
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "scales": ints}
    return _copy(node, [g.twin[x]], "Upsample", NCHWC, attrs), [(node.output[0], out)]


def run_blocked_regions(graph: onnx.GraphProto, shape: Callable[[str], list | None], block: int) -> RegionResult:
    """Rewrite every region that pays in ``graph`` (in place); returns what was done."""
    g = _Graph(graph, shape, block)
    planned: dict[int, tuple[onnx.NodeProto, list[str]]] = {}
    for node in graph.node:  # topological: a node's blocked inputs are known when it is reached
        made = _blocked_node(node, g)
        if made is None:
            continue
        new, outs = made
        planned[id(node)] = (new, [plain for plain, _ in outs])
        for (plain, dims), blocked in zip(outs, new.output):
            g.twin[plain], g.channels[plain], g.known[plain] = blocked, dims[1], dims
    result = RegionResult()
    if not planned:
        return result
    regions = _regions(graph, g, planned)
    accepted: set[int] = set()
    for members in regions:
        removed, added = _balance(members, g, planned)
        if added < removed:
            accepted |= members
            result.regions += 1
        else:
            result.kept += 1
    if accepted:
        _rewrite(g, planned, accepted)
        for i in accepted:
            new = planned[i][0]
            result.moved[new.op_type] += 1
            if new.domain == DOMAIN and (new.op_type.startswith(BLOCKED_CHAIN) or new.op_type == SCALE):
                result.native_ops.add(new.op_type)
    return result


def _regions(graph, g: _Graph, planned) -> list[set[int]]:
    """Planned nodes grouped: joined when one reads the other's output or both read one reorder."""
    parent = {i: i for i in planned}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    by_id = {id(n): n for n in graph.node}
    for i in planned:
        node = by_id[i]
        for t in node.input:
            p = g.producer.get(t)
            if p is not None and id(p) in planned:
                parent[find(i)] = find(id(p))
            if p is not None and _is_plain_reorder(p, "ReorderOutput"):
                for other in g.consumers_of(t):
                    if id(other) in planned:
                        parent[find(i)] = find(id(other))
    groups: dict[int, set[int]] = collections.defaultdict(set)
    for i in planned:
        groups[find(i)].add(i)
    return list(groups.values())


def _balance(members: set[int], g: _Graph, planned) -> tuple[int, int]:
    """(reorders the region removes, reorders it adds)."""
    nodes = [n for n in g.graph.node if id(n) in members]
    removed, added = 0, 0
    seen: set[str] = set()
    for n in nodes:
        for t in n.input:
            p = g.producer.get(t)
            if t in seen or p is None or not _is_plain_reorder(p, "ReorderOutput"):
                continue
            seen.add(t)
            if t not in g.graph_outputs and all(id(u) in members for u in g.consumers_of(t)):
                removed += 1
        for plain in planned[id(n)][1]:
            users = g.consumers_of(plain)
            removed += sum(1 for u in users if _feeds_blocks(u, g))
            if plain in g.graph_outputs or any(id(u) not in members and not _feeds_blocks(u, g) for u in users):
                added += 1
    return removed, added


def _feeds_blocks(node: onnx.NodeProto, g: _Graph) -> bool:
    """A ReorderInput a region's blocked output replaces (not one the graph returns)."""
    return _is_plain_reorder(node, "ReorderInput") and node.output[0] not in g.graph_outputs


def _rewrite(g: _Graph, planned, accepted: set[int]) -> None:
    """Replace the accepted nodes; the graph is changed only at the commit, once the new order is known."""
    for n in g.graph.node:
        if id(n) not in accepted:
            continue
        new, plains = planned[id(n)]
        kept_plain = []
        for plain, blocked in zip(plains, new.output):
            users = g.consumers_of(plain)
            for u in users:
                if _feeds_blocks(u, g):  # its readers read the blocked output itself
                    g.rewire(u.output[0], blocked)
                    g.drop(u)
            if plain in g.graph_outputs or any(id(u) not in accepted and not _feeds_blocks(u, g) for u in users):
                kept_plain.append(helper.make_node("ReorderOutput", [blocked], [plain], domain=NCHWC,
                                                   channels=g.channels[plain], channels_last=0,
                                                   name=f"{plain}/reorder_output"))
        # the ReorderOutputs before it and constants only it read (a Resize's scales) go at the commit
        g.replace(n, new, *kept_plain)
    g.commit()
