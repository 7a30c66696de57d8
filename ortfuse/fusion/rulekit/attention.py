"""Matching blocks of the attention rule: the pieces of scaled dot-product attention as torch's
exporters write them (TorchScript at opset 14, dynamo at opset 18), each returning what it read or
None (not this piece), or a str naming why the piece cannot be fused.

- ``projection``: ``x @ W [+ b]`` (Add in either order, or no bias), W a constant [D, D'];
- ``heads``: ``Transpose(Reshape(t, target), [0, 2, 1, 3])``, the target [B, S, H, d] with H and d
  constants (one of them may be -1: D / d heads, or D / H per head) and B, S proven by ``Sizes``
  (constants, copies, or dims read through Shape from a tensor of the same batch and sequence, int
  Casts between them taken through); or one part of a packed projection (``packed_heads``, ViT's
  and SVTR's qkv Linear);
- ``key_transposed``: K^T as Transpose([0, 1, 3, 2]) of the heads, Transpose([0, 2, 3, 1]) of the
  Reshape, or the heads' last two axes swapped through rank 3 (Reshape, Transpose, Reshape);
- ``nan_guard``: ``Where(IsNaN(p), 0, p)`` after the Softmax (torch's SDPA export);
- ``merge_heads``: ``Reshape(Transpose(t, [0, 2, 1, 3]), target)`` with a target proven [B, S, D],
  after an optional Reshape of t to its own shape;
- ``padding_mask``: the additive mask built from a [batch, seq] ``attention_mask``:
  ``(1 - Cast(Unsqueeze(m)))`` times a constant (TorchScript), or ``Where(Cast(1 - Cast(Expand(
  Unsqueeze(m)))), c, 1 - ...)`` (Hugging Face's SDPA mask, dynamo);
- ``shape_nodes``: the Shape/Gather/Concat/... nodes computing Reshape targets used only there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ortfuse.fusion.rulekit.checks import attr
from ortfuse.ir.graph import GraphIndex

SHAPE_OPS = {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Constant", "Identity"}
INTEGER_OR_BOOL = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL}
INT_TYPES = {onnx.TensorProto.INT64, onnx.TensorProto.INT32}


@dataclass
class Projection:
    x: str
    w: np.ndarray  # [D, D'] float64
    b: np.ndarray  # [D'] float64
    nodes: list[onnx.NodeProto]
    output: str


@dataclass
class Heads:
    proj: Projection
    heads: int
    size: int
    nodes: list[onnx.NodeProto]  # Reshape, Transpose (and the nodes of K's transpose)
    targets: list[str]  # the Reshape targets read


def scalar(ix: GraphIndex, name: str) -> float | None:
    value = ix.const(name)
    if value is None or value.size != 1 or value.dtype.kind != "f":
        return None
    return float(value.reshape(-1)[0])


def projection(ix: GraphIndex, tensor: str) -> Projection | None:
    """``tensor`` = x @ W [+ b], W a constant 2-D matrix, b a constant vector of W's columns."""
    nodes: list[onnx.NodeProto] = []
    bias = None
    add = ix.parent(tensor, "Add")
    if add is not None:
        for i in (0, 1):
            mm = ix.parent(add.input[i], "MatMul")
            b = ix.const(add.input[1 - i])
            if mm is not None and b is not None:
                nodes, bias, tensor = [add], b, add.input[i]
                break
        else:
            return None
    mm = ix.parent(tensor, "MatMul")
    if mm is None:
        return None
    w = ix.const(mm.input[1])
    if w is None or w.ndim != 2:
        return None
    n = w.shape[1]
    if bias is None:
        bias = np.zeros(n)
    elif bias.size != n or any(d != 1 for d in bias.shape[:-1]):
        return None
    return Projection(mm.input[0], w.astype(np.float64), bias.astype(np.float64).reshape(n), [mm] + nodes,
                      nodes[-1].output[0] if nodes else mm.output[0])


@dataclass(frozen=True)
class DimOf:
    """The run-time size of axis ``axis`` (negative: from the end) of ``tensor``, read through Shape."""

    tensor: str
    axis: int

    def __str__(self) -> str:
        return f"dim {self.axis} of '{self.tensor}'"


Entry = int | DimOf | None  # an entry of a shape tensor: a constant, a dim read by Shape, or unknown
# the sizes a match reasons about; "BH" (batch x heads) is only ever the -1 of a Reshape target
SIZE_NAMES = {"B": "batch", "S": "sequence", "H": "head count", "d": "head size", "D": "hidden size",
              "BH": "batch x heads"}
SPLIT = ("B", "S", "H", "d")  # heads split off: [B, S, H, d]
HEADS_FIRST = ("B", "H", "S", "d")
HEADS_MERGED = ("B", "S", "D")
KEY_T = ("B", "H", "d", "S")


class Sizes:
    """What one match knows of its tensors' sizes, by name: B (batch), S (sequence), H (heads), d (head
    size), D = H d. It proves that a Reshape target computed at run time is the shape the fused op
    assumes: an entry is a size when it is the same constant, or a Shape dim of a tensor whose sizes
    the match knows by construction (x, the projections, the heads), or a dim ONNX shape inference gives
    the same symbol or value as x's (inference names two dims alike only where it deduced them equal,
    or where the model's own inputs declare them so)."""

    def __init__(self, ix: GraphIndex, x: str) -> None:
        self.ix = ix
        self.dims: dict[str, tuple[str, ...]] = {x: HEADS_MERGED}
        shape = ix.shape(x)
        lead = shape[:2] if shape is not None and len(shape) == 3 else [None, None]
        self.value: dict[str, int | str | None] = {"B": lead[0], "S": lead[1]}

    def split(self, heads: int, size: int) -> None:
        self.value.update(H=heads, d=size, D=heads * size)

    def know(self, tensor: str, names: tuple[str, ...]) -> None:
        self.dims[tensor] = names

    def rank(self, tensor: str) -> int | None:
        if tensor in self.dims:
            return len(self.dims[tensor])
        shape = self.ix.shape(tensor)
        return None if shape is None else len(shape)

    def is_size(self, entry: Entry, name: str) -> bool:
        """``entry`` is provably the size ``name``."""
        if isinstance(entry, DimOf):
            names = self.dims.get(entry.tensor)
            if names is not None:
                return -len(names) <= entry.axis < len(names) and names[entry.axis] == name
            shape = self.ix.shape(entry.tensor)
            if shape is None or not -len(shape) <= entry.axis < len(shape):
                return False
            dim = shape[entry.axis]
            return dim is not None and dim == self.value.get(name)
        return isinstance(entry, int) and entry > 0 and entry == self.value.get(name)

    def entries(self, target: str) -> list[Entry] | None:
        """The entries of the 1-D int64 shape tensor ``target``: a constant, or a Concat of constants
        and pieces read from Shape (Shape with start/end, Gather of a Shape, Unsqueeze of a scalar
        Gather, Slice of a Shape); other 1-element run-time pieces are None (unknown); None when a
        piece's length is not known."""
        value = self.ix.const(target)
        if value is not None:
            return [int(v) for v in value.reshape(-1)]
        concat = self.ix.parent(target, "Concat")
        pieces = list(concat.input) if concat is not None else [target]
        entries: list[Entry] = []
        for piece in pieces:
            part = self._piece(piece)
            if part is None:
                return None
            entries += part
        return entries

    def _piece(self, tensor: str) -> list[Entry] | None:
        ix = self.ix
        tensor = self._uncast(tensor)
        value = ix.const(tensor)
        if value is not None:
            return [int(v) for v in value.reshape(-1)]
        unsqueeze = ix.parent(tensor, "Unsqueeze")
        if unsqueeze is not None and _axes(ix, unsqueeze) == [0]:
            scalar_dim = self._shape_dims(unsqueeze.input[0])
            if scalar_dim is not None and len(scalar_dim) == 1:
                return scalar_dim
        dims = self._shape_dims(tensor)
        if dims is not None:
            return dims
        shape = ix.shape(tensor)
        if shape is not None and len(shape) == 1 and isinstance(shape[0], int):
            return [None] * shape[0]
        return None

    def _shape_dims(self, tensor: str) -> list[Entry] | None:
        """Dims read from a Shape: Shape(t, start, end), Gather(Shape(t), const), Slice(Shape(t), ...)."""
        ix = self.ix
        node = ix.producer.get(self._uncast(tensor))
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Shape":
            rank = self.rank(node.input[0])
            start, end = attr(node, "start", 0), attr(node, "end", None)
            if rank is None and (start < 0 or end is None or end < 0):
                return None
            read = range(*slice(start, end).indices(rank)) if rank is not None else range(start, end)
            return [DimOf(node.input[0], a) for a in read]
        if node.op_type not in ("Gather", "Slice"):
            return None
        source = self._shape_dims(node.input[0])
        if source is None:
            return None
        if node.op_type == "Gather":
            index = ix.const(node.input[1])
            if attr(node, "axis", 0) != 0 or index is None or index.ndim > 1:
                return None
            picked = [source[int(i)] for i in index.reshape(-1) if -len(source) <= int(i) < len(source)]
            return picked if len(picked) == index.size else None
        # Slice(shape, starts, ends[, axes[, steps]]) with one constant start and end, axis 0, step 1
        starts, ends, axis, step = [_one_int(ix, t) for t in node.input[1:5]] + [None, None, 0, 1][len(node.input) - 1:]
        if starts is None or ends is None or axis not in (0, -1) or step != 1:
            return None
        return source[starts:ends]

    def _uncast(self, tensor: str) -> str:
        """The integer tensor behind Casts between int32 and int64 (paddle2onnx casts its shape
        arithmetic to int32 and back; a tensor's dims fit int32's range)."""
        while True:
            cast = self.ix.parent(tensor, "Cast")
            if cast is None or attr(cast, "to") not in INT_TYPES or self.ix.elem_type(cast.input[0]) not in INT_TYPES:
                return tensor
            tensor = cast.input[0]

    def reshape_problem(self, entries: list[Entry] | None, want: tuple[str, ...], source: tuple[str, ...],
                        allowzero: int) -> str:
        """Why Reshape(t, entries) of ``t`` sized ``source`` is not provably sized ``want`` ("" when it
        is): every entry the size or a copy (0, allowzero off) of the same size of ``t``, but at most
        one -1, which is then the one size left (``source`` and ``want`` hold the same product)."""
        if entries is None:
            return "its target has entries of unknown length"
        if len(entries) != len(want):
            return f"its target has {len(entries)} entries, not {len(want)}"
        inferred = False
        for i, (entry, name) in enumerate(zip(entries, want)):
            if self.is_size(entry, name):
                continue
            if entry == 0 and not allowzero and i < len(source) and source[i] == name:
                continue
            if entry == -1 and not inferred:
                inferred = True
                continue
            shown = "a value computed at run time" if entry is None else str(entry)
            return f"entry {i} of its target ({shown}) is not provably the {SIZE_NAMES[name]}"
        return ""


def _one_int(ix: GraphIndex, tensor: str) -> int | None:
    value = ix.const(tensor) if tensor else None
    return None if value is None or value.size != 1 else int(value.reshape(-1)[0])


def head_split(entries: list[Entry] | None, width: int) -> tuple[int, int] | str:
    """(heads, head size) from a split-heads target [.., .., H, d] over a projection of ``width`` columns."""
    if entries is None or len(entries) != 4:
        return "the heads' Reshape target is not [batch, seq, heads, head size]"
    h, d = entries[2], entries[3]
    if not isinstance(h, int) or not isinstance(d, int) or h == d == -1 or min(h, d) < -1 or 0 in (h, d):
        return "the heads' Reshape target does not end in (heads, head size) known before run time"
    # [.., .., -1, d] -> H = D / d (transformers' view(*shape[:-1], -1, head_size)); [.., .., H, -1] -> d = D / H
    if h == -1 or d == -1:
        known = d if h == -1 else h
        if width % known:
            what = "head size" if h == -1 else "head count"
            return f"the {what} {known} does not divide the projection's {width} columns"
        h, d = (width // d, d) if h == -1 else (h, width // h)
    if h * d != width:
        return f"the Reshape to {h} heads of {d} does not split the projection's {width} columns"
    return h, d


def heads(ix: GraphIndex, tensor: str, perm: tuple[int, ...] = (0, 2, 1, 3)) -> Heads | str | None:
    """``tensor`` = Transpose(Reshape(projection, [B, S, H, d]), perm): H and d constants (one may be
    -1), B and S proven (``Sizes``); or, for [B, H, S, d], a part of a packed projection."""
    if perm == (0, 2, 1, 3) and ix.parent(tensor, "Squeeze") is not None:
        return packed_heads(ix, tensor)
    tr = ix.parent(tensor, "Transpose")
    if tr is None or tuple(attr(tr, "perm", ())) != perm:
        return None
    rs = ix.parent(tr.input[0], "Reshape")
    if rs is None:
        return None
    proj = projection(ix, rs.input[0])
    if proj is None:
        return None
    sizes = Sizes(ix, proj.x)
    sizes.know(proj.output, HEADS_MERGED)
    entries = sizes.entries(rs.input[1])
    split = head_split(entries, proj.w.shape[1])
    if isinstance(split, str):
        return split
    sizes.split(*split)
    # Reshape(t, Concat(Gather(Shape(u), 0), Gather(Shape(u), 1), ..)) -> [B, S, ..] when u's dims 0, 1 are x's
    problem = sizes.reshape_problem(entries, SPLIT, HEADS_MERGED, attr(rs, "allowzero", 0))
    if problem:
        return f"the heads' Reshape is not provably [batch, seq, {split[0]}, {split[1]}]: {problem}"
    return Heads(proj, split[0], split[1], [rs, tr], [rs.input[1]])


PACKED = (2, 0, 3, 1, 4)  # [B, S, 3, H, d] -> [3, B, H, S, d]


def packed_heads(ix: GraphIndex, tensor: str) -> Heads | str | None:
    """``tensor`` = Squeeze(Slice(T, [i], [i + 1], axis 0), axis 0), T = Transpose(Reshape(qkv, [B, S, 3,
    H, d]), [2, 0, 3, 1, 4]), qkv = x @ W [+ b] with 3 H d columns (one Linear for Q, K and V, as ViT
    and PP-OCR's SVTR write it): the heads of part i, whose projection is the i-th third of W's and
    b's columns. H, d, B and S as ``heads`` proves them; the entry before H must be the constant 3."""
    sq = ix.parent(tensor, "Squeeze")
    sl = None if sq is None or _axes(ix, sq) != [0] else ix.parent(sq.input[0], "Slice")
    if sq is None or sl is None:
        return None
    start, end, axis, step = [_one_int(ix, t) for t in sl.input[1:5]] + [None, None, 0, 1][len(sl.input) - 1:]
    tr = ix.parent(sl.input[0], "Transpose")
    if start is None or end != start + 1 or not 0 <= start < 3 or axis != 0 or step != 1 \
            or tr is None or tuple(attr(tr, "perm", ())) != PACKED:
        return None
    rs = ix.parent(tr.input[0], "Reshape")
    proj = None if rs is None else projection(ix, rs.input[0])
    if rs is None or proj is None:
        return None
    width = proj.w.shape[1]
    sizes = Sizes(ix, proj.x)
    sizes.know(proj.output, HEADS_MERGED)
    entries = sizes.entries(rs.input[1])
    if entries is None or len(entries) != 5 or entries[2] != 3 or width % 3:
        return "the packed projection's Reshape target is not [batch, seq, 3, heads, head size]"
    split = head_split(entries[:2] + entries[3:], width // 3)
    if isinstance(split, str):
        return split
    sizes.split(*split)
    problem = sizes.reshape_problem(entries[:2] + entries[3:], SPLIT, HEADS_MERGED, attr(rs, "allowzero", 0))
    if problem:
        return f"the packed heads' Reshape is not provably [batch, seq, 3, {split[0]}, {split[1]}]: {problem}"
    part = slice(start * (width // 3), (start + 1) * (width // 3))
    third = Projection(proj.x, proj.w[:, part], proj.b[part], proj.nodes, proj.output)
    return Heads(third, split[0], split[1], [rs, tr, sl, sq], [rs.input[1]])


def key_transposed(ix: GraphIndex, tensor: str) -> Heads | str | None:
    """K^T [B, H, d, S]: Transpose([0, 1, 3, 2]) of the heads, Transpose([0, 2, 3, 1]) of the Reshape,
    or the heads' last two axes swapped through rank 3 (torch's dynamo export of ``k.transpose(-2, -1)``)."""
    tr = ix.parent(tensor, "Transpose")
    if tr is not None:
        if tuple(attr(tr, "perm", ())) == (0, 1, 3, 2):
            k = heads(ix, tr.input[0])
            if isinstance(k, Heads):
                k.nodes.append(tr)
            return k
        return heads(ix, tensor, perm=(0, 2, 3, 1))
    # Reshape(Transpose(Reshape(K, [-1, S, d]), [0, 2, 1]), [B, H, d, S]) -> Transpose(K, [0, 1, 3, 2])
    outer = ix.parent(tensor, "Reshape")
    middle = None if outer is None else ix.parent(outer.input[0], "Transpose")
    inner = None if middle is None else ix.parent(middle.input[0], "Reshape")
    if outer is None or middle is None or inner is None or tuple(attr(middle, "perm", ())) != (0, 2, 1):
        return None
    k = heads(ix, inner.input[0])
    if not isinstance(k, Heads):
        return k
    sizes = Sizes(ix, k.proj.x)
    sizes.split(k.heads, k.size)
    sizes.know(inner.input[0], HEADS_FIRST)
    problem = (sizes.reshape_problem(sizes.entries(inner.input[1]), ("BH", "S", "d"), HEADS_FIRST,
                                     attr(inner, "allowzero", 0))
               or sizes.reshape_problem(sizes.entries(outer.input[1]), KEY_T, ("BH", "d", "S"),
                                        attr(outer, "allowzero", 0)))
    if problem:
        return f"K's transpose through rank 3 is not provably [batch, heads, head size, seq]: the Reshape {problem}"
    k.nodes += [inner, middle, outer]
    k.targets += [inner.input[1], outer.input[1]]
    return k


def nan_guard(ix: GraphIndex, probs: str) -> tuple[list[onnx.NodeProto], str]:
    """([IsNaN, Where], the Where's output) when ``probs`` is read only by Where(IsNaN(probs), 0,
    probs), which torch's SDPA export puts after the Softmax (a row whose every key is masked with
    -inf is NaN there, 0 after it); ([], probs) otherwise."""
    users = ix.consumers_of(probs)
    isnan = next((n for n in users if n.op_type == "IsNaN"), None)
    if isnan is None or len(users) != 2 or probs in ix.graph_outputs:
        return [], probs
    where = ix.child(isnan.output[0], "Where", domain=None)
    if (where is None or list(where.input[::2]) != [isnan.output[0], probs]
            or not any(u is where for u in users) or scalar(ix, where.input[1]) != 0.0):
        return [], probs
    return [isnan, where], where.output[0]


def finite_mask(ix: GraphIndex, mask: str) -> bool:
    """The additive mask is provably finite: none, or Where(c, a, b) of finite constants a and b."""
    if not mask:
        return True
    where = ix.parent(mask, "Where")
    branches = [] if where is None else [ix.const(t) for t in where.input[1:]]
    return bool(branches) and all(b is not None and bool(np.isfinite(b).all()) for b in branches)


def merge_heads(ix: GraphIndex, tensor: str, sizes: Sizes) -> tuple[list[onnx.NodeProto], str, list[str]] | str | None:
    """From ``tensor`` [B, H, S, d]: (the nodes, output and Reshape targets of Transpose [0, 2, 1, 3]
    then Reshape to [B, S, D]; before them, a Reshape of ``tensor`` to its own shape is taken along),
    the reason a Reshape is not provably that, or None."""
    nodes: list[onnx.NodeProto] = []
    targets: list[str] = []
    sizes.know(tensor, HEADS_FIRST)
    first = _only_reader(ix, tensor)
    # Reshape(ctx, Concat(Gather(Shape(ctx), 0), [-1], Gather(Shape(q), 2), Gather(Shape(v), 3))) -> ctx
    # (torch's SDPA export)
    if first is not None and first.op_type == "Reshape" and first.input[0] == tensor:
        problem = sizes.reshape_problem(sizes.entries(first.input[1]), HEADS_FIRST, HEADS_FIRST,
                                        attr(first, "allowzero", 0))
        if problem:
            return f"the Reshape of the attention's output is not provably to its own shape: {problem}"
        nodes.append(first)
        targets.append(first.input[1])
        tensor = first.output[0]
        sizes.know(tensor, HEADS_FIRST)
        first = _only_reader(ix, tensor)
    tr = first
    if tr is None or tr.op_type != "Transpose" or tuple(attr(tr, "perm", ())) != (0, 2, 1, 3):
        return None
    sizes.know(tr.output[0], SPLIT)
    # the only Reshape of it; other readers (Shape nodes building the target) go with the match
    reshapes = [n for n in ix.consumers_of(tr.output[0]) if n.op_type == "Reshape" and n.input[0] == tr.output[0]]
    if len(reshapes) != 1 or tr.output[0] in ix.graph_outputs:
        return None
    rs = reshapes[0]
    # Reshape(.., Concat(Gather(Shape(u), 0), Gather(Shape(u), 1), [-1])) -> [B, S, D]
    problem = sizes.reshape_problem(sizes.entries(rs.input[1]), HEADS_MERGED, SPLIT, attr(rs, "allowzero", 0))
    if problem:
        return f"the heads are not merged back to [batch, seq, {sizes.value['D']}]: the Reshape {problem}"
    return nodes + [tr, rs], rs.output[0], targets + [rs.input[1]]


def _only_reader(ix: GraphIndex, tensor: str) -> onnx.NodeProto | None:
    """The one reader of ``tensor`` besides Shape nodes (which build targets and go with the match)."""
    readers = [n for n in ix.consumers_of(tensor) if n.op_type != "Shape"]
    return readers[0] if len(readers) == 1 and tensor not in ix.graph_outputs else None


def _unsqueezed_mask(ix: GraphIndex, tensor: str) -> str | None:
    """The [B, S] mask behind Unsqueeze(m, [1, 2]) or Unsqueeze(Unsqueeze(m, 1), 2)."""
    u = ix.parent(tensor, "Unsqueeze")
    if u is None:
        return None
    axes = _axes(ix, u)
    if axes == [1, 2]:
        return u.input[0]
    if axes == [2]:
        inner = ix.parent(u.input[0], "Unsqueeze")
        if inner is not None and _axes(ix, inner) == [1]:
            return inner.input[0]
    return None


def _axes(ix: GraphIndex, node: onnx.NodeProto) -> list[int] | None:
    if len(node.input) > 1:
        value = ix.const(node.input[1])
        return None if value is None else sorted(int(v) for v in value.reshape(-1))
    axes = attr(node, "axes")
    return None if axes is None else sorted(int(v) for v in axes)


def _one_minus_mask(ix: GraphIndex, tensor: str) -> str | None:
    """The [B, S] mask m behind ``1 - Cast(Unsqueeze(m))`` (or with an Expand after the Unsqueeze)."""
    sub = ix.parent(tensor, "Sub")
    if sub is None or scalar(ix, sub.input[0]) != 1.0:
        return None
    cast = ix.parent(sub.input[1], "Cast")
    if cast is None or attr(cast, "to") != onnx.TensorProto.FLOAT:
        return None
    source = cast.input[0]
    expand = ix.parent(source, "Expand")
    if expand is not None:
        source = expand.input[0]
    return _unsqueezed_mask(ix, source)


def padding_mask(ix: GraphIndex, bias: str) -> tuple[str, float] | None:
    """(attention_mask, the value added where it is 0) when the additive mask ``bias`` is built from a
    [batch, seq] integer or bool mask as the exporters write it, else None."""
    found: tuple[str | None, float | None] = (None, None)
    mul = ix.parent(bias, "Mul")
    where = ix.parent(bias, "Where")
    if mul is not None:
        for i in (0, 1):
            c = scalar(ix, mul.input[1 - i])
            if c is not None:
                found = (_one_minus_mask(ix, mul.input[i]), c)
                break
    elif where is not None:
        cond = ix.parent(where.input[0], "Cast")
        c = scalar(ix, where.input[1])
        if cond is not None and attr(cond, "to") == onnx.TensorProto.BOOL and cond.input[0] == where.input[2]:
            found = (_one_minus_mask(ix, where.input[2]), c)
    mask, value = found
    if mask is None or value is None:
        return None
    shape = ix.shape(mask)
    if ix.elem_type(mask) not in INTEGER_OR_BOOL or shape is None or len(shape) != 2:
        return None
    return mask, value


def shape_nodes(ix: GraphIndex, targets: list[str], inside: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes computing the Reshape ``targets`` (Shape, Gather, Concat, ...) whose every output is
    read only by ``inside`` or by each other: they go with the match."""
    members = {id(n) for n in inside}
    found: list[onnx.NodeProto] = []
    frontier = list(targets)
    seen: set[str] = set()
    changed = True
    while changed:
        changed = False
        for tensor in list(frontier):
            if tensor in seen or not tensor:
                continue
            node = ix.producer.get(tensor)
            if node is None or node.op_type not in SHAPE_OPS or id(node) in members:
                continue
            users = [u for o in node.output for u in ix.consumers_of(o)]
            if any(o in ix.graph_outputs for o in node.output) or any(id(u) not in members for u in users):
                continue
            members.add(id(node))
            found.append(node)
            seen.add(tensor)
            frontier += list(node.input)
            changed = True
    return found
