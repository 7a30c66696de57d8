"""embed_layernorm: a BERT-style encoder's embeddings, Gather(word, ids) + Gather(token_type, type ids)
+ Gather(position, Slice(position_ids, 0, seq)) followed by a LayerNorm over the last axis, as one
FusedEmbedLayerNorm.

Matched as torch's exporters write it: the three Gathers summed by two Adds in any grouping; the
position ids a constant [1, P] (or [P]) sliced along their last axis from 0 to the sequence length,
which is dim 1 of one of the two id tensors, read as Shape(ids, start=1, end=2) (dynamo, opset 18)
or Shape -> Gather(1) -> Unsqueeze (TorchScript); the LayerNorm the op or its opset < 17
decomposition (``rulekit.layernorm``). The position rows are folded: the match takes Positions =
position[position_ids] (the table itself when the ids are 0..P-1), so the fused op reads row s of it
for token s, and the sequence may not outgrow it, as in the Slice.

ORT's own EmbedLayerNormalization is no form here: it takes int32 ids only and fails on a negative
id ("input index out of range"), which ORT's Gather takes (any id in [-V, V-1]). Both forms here keep
Gather's contract: a negative id counts from the end of its table, an id outside it is an ORT error.
Ids must be int64 (what the exporters write). Left alone, with the reason: run-time or computed
position ids, constant token-type ids, int32 ids, a sum read outside the LayerNorm.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse.custom_ops.specs import OpSpec
from ortfuse.fusion.rulekit.attention import shape_nodes
from ortfuse.fusion.rulekit.checks import attr, float32_problem, intermediate_problem
from ortfuse.fusion.rulekit.contract import Anchor, Example, LoweringForm, NativeKernel, PatternRule
from ortfuse.fusion.rulekit.examples import layer_norm_nodes, model, weights
from ortfuse.fusion.rulekit.layernorm import layer_norm, lowered_layer_norm
from ortfuse.fusion.rulekit.lowering import Context, node
from ortfuse.fusion.rulekit.result import Lowered, Match, Reject
from ortfuse.ir.graph import GraphIndex

ID = "embed_layernorm"
INPUTS = ("Ids", "TypeIds", "Word", "Types", "Positions", "Gamma", "Beta")


def _summands(ix: GraphIndex, add: onnx.NodeProto) -> tuple[list[str], list[onnx.NodeProto]]:
    """The leaves of the tree of Adds ending in ``add`` (an inner Add read only by its parent is opened)."""
    leaves, adds, todo = [], [add], list(add.input)
    while todo:
        t = todo.pop(0)
        inner = ix.parent(t, "Add")
        if inner is not None and len(inner.input) == 2 and ix.only_consumer(t) is not None and len(adds) < 2:
            adds.append(inner)
            todo += list(inner.input)
        else:
            leaves.append(t)
    return leaves, adds


def _seq_of(ix: GraphIndex, tensor: str) -> str | None:
    """The tensor whose dim 1 ``tensor`` is, as [n]: Shape(x, start=1, end=2) or Unsqueeze(Gather(Shape(x), 1), 0)."""
    shape = ix.parent(tensor, "Shape")
    if shape is not None:
        return shape.input[0] if attr(shape, "start", 0) == 1 and attr(shape, "end") == 2 else None
    unsq = ix.parent(tensor, "Unsqueeze")
    gather = None if unsq is None else ix.parent(unsq.input[0], "Gather")
    if unsq is None or gather is None or attr(gather, "axis", 0) != 0:
        return None
    axes = ix.const(unsq.input[1]) if len(unsq.input) > 1 else np.array(attr(unsq, "axes") or [])
    index = ix.const(gather.input[1])
    shape = ix.parent(gather.input[0], "Shape")
    if axes is None or axes.reshape(-1).tolist() != [0] or index is None or index.shape != () or int(index) != 1:
        return None
    if shape is None or attr(shape, "start", 0) != 0 or attr(shape, "end") is not None:
        return None
    return shape.input[0]


def _positions(ix: GraphIndex, slice_out: str) -> tuple[np.ndarray, str] | str:
    """(the position ids, the tensor giving the sequence length) of Slice(ids, [0], seq, [last axis], [1])."""
    sl = ix.parent(slice_out, "Slice")
    if sl is None:
        return "the position ids are not a Slice of constant ids"
    ids = ix.const(sl.input[0])
    starts = ix.const(sl.input[1])
    axes = ix.const(sl.input[3]) if len(sl.input) > 3 and sl.input[3] else None
    steps = ix.const(sl.input[4]) if len(sl.input) > 4 and sl.input[4] else np.array([1])
    if ids is None or ids.ndim not in (1, 2) or (ids.ndim == 2 and ids.shape[0] != 1):
        return "the position ids are not a constant [1, P] or [P]"
    if ids.dtype != np.int64:
        return f"the position ids are {ids.dtype}; the kernel reads int64"
    if (starts is None or starts.reshape(-1).tolist() != [0] or steps is None or steps.reshape(-1).tolist() != [1]
            or axes is None or axes.reshape(-1).tolist() not in ([ids.ndim - 1], [-1])):
        return "the position ids are not sliced from 0 with step 1 along their last axis"
    seq_of = _seq_of(ix, sl.input[2])
    if seq_of is None:
        return "the position ids do not end at the sequence length (dim 1 of the ids)"
    return ids.reshape(-1), seq_of


def _gather(ix: GraphIndex, tensor: str) -> onnx.NodeProto | None:
    g = ix.parent(tensor, "Gather")
    return g if g is not None and attr(g, "axis", 0) == 0 else None


def _ids_problem(ix: GraphIndex, ids: str) -> str:
    elem, shape = ix.elem_type(ids), ix.shape(ids)
    if elem != onnx.TensorProto.INT64:
        name = onnx.helper.tensor_dtype_to_np_dtype(elem).name if elem else "unknown"
        return f"ids '{ids}' are {name}; the kernel reads int64"
    if shape is None or len(shape) != 2:
        return f"ids '{ids}' are not known to be [batch, seq]"
    return ""


# Add(Add(Gather(word, ids), Gather(type, type_ids)), Gather(pos, Slice(position_ids, 0, seq))) -> LayerNorm
#   ->   FusedEmbedLayerNorm(ids, type_ids, word, type, position[position_ids], gamma, beta)
def match(ix: GraphIndex, anchor: onnx.NodeProto) -> Match | Reject | None:
    if len(anchor.input) != 2:
        return None
    ln = layer_norm(ix, anchor.output[0])
    if ln is None:
        return None
    leaves, adds = _summands(ix, anchor)
    gathers = [_gather(ix, t) for t in leaves]
    if len(leaves) != 3 or any(g is None for g in gathers):
        return None
    tables = [ix.const(g.input[0]) for g in gathers]  # type: ignore[union-attr]
    hidden = ln.gamma.size
    if any(t is None or t.ndim != 2 or t.shape[1] != hidden for t in tables):
        return None
    sliced = [ix.parent(g.input[1], "Slice") is not None for g in gathers]  # type: ignore[union-attr]
    nodes = adds + [g for g in gathers if g is not None] + ln.nodes
    if sum(sliced) != 1 or any(ix.const(g.input[1]) is not None for g, s in zip(gathers, sliced) if not s and g):
        return Reject(ID, nodes, "the embedding sum needs two Gathers of run-time ids (word, token type) and one of "
                                 "the position Slice; constant token-type ids are not matched")
    p = sliced.index(True)
    pos_gather, table = gathers[p], tables[p]
    assert pos_gather is not None and table is not None
    found = _positions(ix, pos_gather.input[1])
    if isinstance(found, str):
        return Reject(ID, nodes, found)
    position_ids, seq_of = found
    runtime = [g for i, g in enumerate(gathers) if i != p and g is not None]
    if seq_of not in (runtime[0].input[1], runtime[1].input[1]):
        return Reject(ID, nodes, f"the position ids end at a dim of '{seq_of}', not of the ids")
    if seq_of != runtime[0].input[1]:
        runtime.reverse()  # Ids: the ids the sequence length is read from
    rows = table.shape[0]
    if position_ids.size == 0 or position_ids.min() < -rows or position_ids.max() >= rows:
        return Reject(ID, nodes, f"the position ids are not rows of the {rows}-row position table")
    nodes += shape_nodes(ix, [pos_gather.input[1]], nodes)
    ids, type_ids = runtime[0].input[1], runtime[1].input[1]
    problem = (_ids_problem(ix, ids) or _ids_problem(ix, type_ids)
               or float32_problem(ix, runtime[0].input[0], runtime[1].input[0], pos_gather.input[0], ln.output)
               or intermediate_problem(ix, nodes, ln.output))
    if problem:
        return Reject(ID, nodes, problem)
    base = f"{ix.name_of(anchor)}_fused"
    inits = [numpy_helper.from_array(v.astype(np.float32).reshape(hidden), ix.unique_name(f"{base}_{n}"))
             for n, v in (("gamma", ln.gamma), ("beta", ln.beta))]
    wrapped = np.where(position_ids < 0, position_ids + rows, position_ids)
    if np.array_equal(wrapped, np.arange(rows)):
        positions = pos_gather.input[0]
    else:  # fold position[position_ids] into a table read row by row
        folded = numpy_helper.from_array(table[wrapped].astype(np.float32), ix.unique_name(f"{base}_positions"))
        inits.append(folded)
        positions = folded.name
    inputs = [ids, type_ids, runtime[0].input[0], runtime[1].input[0], positions, inits[0].name, inits[1].name]
    return Match(ID, "FusedEmbedLayerNorm", nodes, inputs, ln.output, {"epsilon": float(ln.epsilon)}, inits)


def reference(ids, type_ids, word, types, positions, gamma, beta, epsilon: float, **_):
    """LayerNorm(word[ids] + types[type_ids] + positions[:seq]) over the last axis, seq = ids.shape[1]:
    ids index as Gather's do (negative from the end; outside the table an error), the sum in float32,
    the LayerNorm in float64."""
    s = word[ids] + types[type_ids] + positions[:ids.shape[1]]
    s = s.astype(np.float64)
    mean = s.mean(axis=-1, keepdims=True)
    var = ((s - mean) ** 2).mean(axis=-1, keepdims=True)
    return ((s - mean) / np.sqrt(var + epsilon) * gamma + beta).astype(np.float32)


# FusedEmbedLayerNorm(Ids[B, S], TypeIds[B, S] int64, Word[Vw, D], Types[Vt, D], Positions[P, D], Gamma[D],
# Beta[D]; epsilon)
SPEC = OpSpec("FusedEmbedLayerNorm", ID, INPUTS, {"epsilon": float}, reference, int64_inputs=("Ids", "TypeIds"))


# FusedEmbedLayerNorm   ->   Gather(Word, Ids) + Gather(Types, TypeIds) + Slice(Positions, 0, S) -> LayerNorm
def lower_gather_add_layernorm(m: Match, ctx: Context) -> Lowered | str:
    """ORT's Gathers (Gather's contract by construction), the position rows sliced off the table, the
    two Adds (broadcasting as the graph's did), then the LayerNorm: the graph as exported, minus the
    position ids. ORT fuses none of it further (its EmbedLayerNormFusion does not match a sliced
    table)."""
    ids, type_ids, word, types, positions, gamma, beta = m.inputs
    names = {k: ctx.fresh(k) for k in ("word_rows", "type_rows", "shape", "seq", "position_rows", "pair_sum",
                                       "embedding_sum")}
    one = numpy_helper.from_array(np.array([1], np.int64), ctx.fresh("one"))
    zero = numpy_helper.from_array(np.array([0], np.int64), ctx.fresh("zero"))
    nodes = [node("Gather", [word, ids], [names["word_rows"]], axis=0),
             node("Gather", [types, type_ids], [names["type_rows"]], axis=0),
             node("Shape", [ids], [names["shape"]]), node("Gather", [names["shape"], one.name], [names["seq"]], axis=0),
             node("Slice", [positions, zero.name, names["seq"], zero.name], [names["position_rows"]]),
             node("Add", [names["word_rows"], names["type_rows"]], [names["pair_sum"]]),
             node("Add", [names["pair_sum"], names["position_rows"]], [names["embedding_sum"]])]
    ln = lowered_layer_norm(names["embedding_sum"], m.output, gamma, beta, float(m.attrs["epsilon"]), ctx)
    return Lowered(nodes + ln.nodes, [one, zero] + ln.initializers)


# Priorities: the lowered form runs as fast as the unfused graph (it is the same ORT ops) and is the
# static choice; the native kernel (custom_ops/native/ops/embed_layernorm.py: the rows
# gathered, added and normalized in one pass) ranks below it statically, and `ortfuse rank MODEL
# --pattern embed_layernorm` puts it first on a machine where it measures faster in the whole model
# (docs/ARCHITECTURE.md §5).
LOWERING = (
    LoweringForm("gather_add_layernorm", "FusedEmbedLayerNorm", "Gather + Add + LayerNormalization",
                 lower_gather_add_layernorm, {"": 30}),
)
NATIVE = (NativeKernel("FusedEmbedLayerNorm"),)


# ------------------------------------------------------------------------------------------------
# examples
# ------------------------------------------------------------------------------------------------
def _embeddings(opset: int = 17, dynamo: bool = True, position_ids: np.ndarray | None = None,
                ids_elem: int = onnx.TensorProto.INT64, const_types: bool = False) -> onnx.ModelProto:
    """word[ids] + type[type_ids] + position[Slice(position_ids, 0, seq)] -> LayerNorm, as the zoo's
    encoders write it (vocabulary 11, 3 types, 6 positions, hidden 8; ids [2, 5])."""
    vocab, hidden = 11, 8
    consts = {"word": weights([vocab, hidden]), "type": weights([3, hidden], seed=1),
              "pos": weights([6, hidden], seed=2), "gamma": 1.0 + weights([hidden], seed=3, scale=0.1),
              "beta": weights([hidden], seed=4, scale=0.1), "pids": np.arange(6, dtype=np.int64)[None, :]
              if position_ids is None else position_ids, "starts": np.array([0], np.int64),
              "axes": np.array([1], np.int64), "steps": np.array([1], np.int64)}
    if dynamo:
        nodes = [helper.make_node("Shape", ["ids"], ["seq"], start=1, end=2)]
    else:
        consts.update({"one": np.array(1, np.int64), "zero_axis": np.array([0], np.int64)})
        nodes = [helper.make_node("Shape", ["ids"], ["shape"]),
                 helper.make_node("Gather", ["shape", "one"], ["dim"], axis=0),
                 helper.make_node("Unsqueeze", ["dim", "zero_axis"], ["seq"])]
    if const_types:
        consts["tids"] = np.zeros((2, 5), np.int64)
    nodes += [helper.make_node("Slice", ["pids", "starts", "seq", "axes", "steps"], ["positions"]),
              helper.make_node("Gather", ["word", "ids"], ["w"], axis=0),
              helper.make_node("Gather", ["type", "tids"], ["t"], axis=0),
              helper.make_node("Add", ["w", "t"], ["wt"]),
              helper.make_node("Gather", ["pos", "positions"], ["p"], axis=0),
              helper.make_node("Add", ["wt", "p"], ["e"])]
    ln, ln_consts = layer_norm_nodes("e", "y", opset)
    nodes += ln
    consts.update(ln_consts)
    inputs = {"ids": [2, 5]} if const_types else {"ids": [2, 5], "tids": [2, 5]}
    return model(nodes, inputs, ["y"], consts, opset=opset, elem=ids_elem)


RULE = PatternRule(
    anchor=Anchor("Add", onnx_only=True),
    id=ID, order=33, matcher=match, specs=(SPEC,), native=NATIVE, lowering=LOWERING,
    examples=(
        Example("dynamo_layernormalization", lambda: _embeddings(18, dynamo=True)),
        Example("torchscript_decomposed", lambda: _embeddings(14, dynamo=False)),
        Example("shuffled_position_ids", lambda: _embeddings(17, position_ids=np.array([[5, 4, 3, 2, 1, -6]]))),
        Example("int32_ids", lambda: _embeddings(17, ids_elem=onnx.TensorProto.INT32), reason="the kernel reads int64"),
        Example("constant_token_types", lambda: _embeddings(17, const_types=True),
                reason="constant token-type ids are not matched"),
    ),
)
