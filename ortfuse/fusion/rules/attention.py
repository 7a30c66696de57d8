"""attention: multi-head scaled dot-product self-attention as torch's exporters (and paddle2onnx, for
ViT-style blocks) write it, from the Q/K/V projections to the heads merged back, as one FusedAttention
lowered to ORT's own contrib ops.

Matched (anchor: the Softmax): Q, K, V = x @ W + b (constant W, b; Add in either order), or the
three parts of one packed projection (Reshape to [B, S, 3, H, d], Transpose [2, 0, 3, 1, 4], Slice
and Squeeze on axis 0: ViT, PP-OCR's SVTR); each
Reshape to [.., .., heads, head size] (target constant or built from Shape nodes) and Transpose to
[B, H, S, d]; K^T by Transpose; scores = Q K^T with the scale once (Div or Mul on the scores) or
split over both sides (Mul on Q and on K^T, dynamo's SDPA); plus an additive mask, or none; Softmax
over the last axis; times V; Transpose and Reshape back to [B, S, hidden]. Heads and head size are
read from the Reshape targets, the scale from the constants. The additive mask must be a float32
tensor of rank 4 that broadcasts to [B, H, S, S] along [B or 1, H or 1, S or 1, S]; other masks (a
rank-2 causal mask, a mask over the heads' size) are left to ORT with the reason. Without a mask the
match's M is a zero [1, 1, 1, 1] initializer and the bias forms pass no mask to ORT's ops (the
raw-mask forms decline). When the mask is built from a [batch, seq] integer or bool
``attention_mask`` (TorchScript: (1 - mask) * c; dynamo: Hugging Face's Where(1 - mask, c, ...)), the
match records it (``key_padding_mask``) and the value c added at its zeros, for the forms that take
the raw mask.

Forms (ORT 1.32 CPU kernels; scale, heads from the match):

- ``attention_bias``: com.microsoft:Attention(x, W_qkv, b_qkv, attention_bias=M expanded to
  [B|1, H|1, S, S]): one GEMM for Q, K and V; the graph's own additive mask, so exact for any mask
  values.
- ``attention_mask``: com.microsoft:Attention(x, W_qkv, b_qkv, mask_index=Cast(attention_mask, int32),
  mask_filter_value=c): equals the graph when the mask holds 0 and 1 (any nonzero keeps the key,
  where the graph would add (1 - m) c).
- ``mha_bias`` / ``mha_mask``: x @ W_qkv -> Split -> com.microsoft:MultiHeadAttention(q, k, v, b_qkv)
  with the same two mask inputs.
- ``native_core``: x @ W_qkv (ORT's MatMul) -> the native FusedAttentionCore(qkv, b_qkv, M), which
  takes the graph's additive mask as it is (exact for any mask values), offered where the native
  path has it.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortfuse.custom_ops.specs import DOMAIN, OpSpec
from ortfuse.fusion.rulekit.attention import (
    Heads,
    Sizes,
    finite_mask,
    heads,
    key_transposed,
    merge_heads,
    nan_guard,
    padding_mask,
    scalar,
    shape_nodes,
)
from ortfuse.fusion.rulekit.checks import attr, float32_problem, intermediate_problem
from ortfuse.fusion.rulekit.contract import Anchor, Example, LoweringForm, PatternRule
from ortfuse.fusion.rulekit.lowering import MS_DOMAIN, Context, node
from ortfuse.fusion.rulekit.result import Lowered, Match, Reject
from ortfuse.ir.graph import GraphIndex

ID = "attention"
CORE_OP = "FusedAttentionCore"  # custom_ops/native/ops/attention_core.py
GUARD_OP = "FusedNanToZero"  # custom_ops/native/ops/nan_to_zero.py


def _scores(ix: GraphIndex, tensor: str):
    """(MatMul, scale factor, scaling nodes) of ``tensor`` = (Q K^T) * s, s applied by Div/Mul on
    the product or by Mul on both operands; None when it is not such a product."""
    factor, nodes = 1.0, []
    for op in ("Div", "Mul"):
        n = ix.parent(tensor, op)
        if n is None:
            continue
        c = scalar(ix, n.input[1])
        data = n.input[0]
        if c is None and op == "Mul":
            c, data = scalar(ix, n.input[0]), n.input[1]
        if c is None or c == 0.0:
            return None
        factor, nodes, tensor = (1.0 / c if op == "Div" else c), [n], data
        break
    mm = ix.parent(tensor, "MatMul")
    if mm is None:
        return None
    operands = []
    for side in mm.input:
        mul = ix.parent(side, "Mul")
        c = None if mul is None else scalar(ix, mul.input[1])
        if mul is not None and c is not None:
            factor, side = factor * c, mul.input[0]
            nodes.append(mul)
        operands.append(side)
    return mm, factor, nodes, operands


def _mask_problem(ix: GraphIndex, mask: str, h: int) -> str:
    """Why the additive mask cannot be an attention_bias broadcast to [B, H, S, S] ("" when it can)."""
    if ix.elem_type(mask) not in (None, TensorProto.FLOAT):
        return f"the additive mask '{mask}' is not float32"
    shape = ix.shape(mask)
    if shape is None:
        return f"the additive mask '{mask}' has an unknown shape"
    if len(shape) != 4:
        return (f"the additive mask '{mask}' has rank {len(shape)}, not the [batch, 1 or heads, seq, seq] "
                "of a padding mask")
    # M[.., n, ..] with n computed at run time (a str or None) -> accepted when H > 1: the graph's Add
    # of M to the [B, H, S, S] scores runs only where n is 1 or H
    if shape[1] not in (1, h) and (isinstance(shape[1], int) or h == 1):
        return f"the additive mask '{mask}' has {shape[1]} rows over the heads, not 1 or {h}"
    return ""


# x -> MatMul+Add (Q, K, V) -> Reshape -> Transpose -> Q K^T * scale + mask -> Softmax -> @ V
#   -> Transpose -> Reshape   ->   FusedAttention(x, W_qkv, b_qkv, mask; num_heads, scale)
def match(ix: GraphIndex, anchor: onnx.NodeProto) -> Match | Reject | None:
    if attr(anchor, "axis", -1 if ix.opset >= 13 else 1) not in (-1, 3):
        return None
    pre = ix.parent(anchor.input[0], "Add")
    candidates = [(pre.input[i], pre.input[1 - i]) for i in (0, 1)] if pre is not None else []
    found = next(((s, m, r) for s, m in candidates if (r := _scores(ix, s)) is not None), None)
    if found is None:
        unmasked = _scores(ix, anchor.input[0])
        if unmasked is None:
            return None
        found, pre = (anchor.input[0], "", unmasked), None
    _, mask, (mm, scale, scale_nodes, (q_side, k_side)) = found
    q, k = heads(ix, q_side), key_transposed(ix, k_side)
    # Softmax -> Where(IsNaN(p), 0, p) -> MatMul   ->   the fused op, its NaN entries set to 0 (nan_to_zero)
    guard, probs = nan_guard(ix, anchor.output[0])
    out_mm = ix.child(probs, "MatMul", domain=None)
    if out_mm is None or out_mm.input[0] != probs:
        readers = sorted({n.op_type for n in ix.consumers_of(probs)}) or ["nothing"]
        if isinstance(q, Heads) and isinstance(k, Heads) and readers != ["MatMul"]:  # say what else reads them
            return Reject(ID, [anchor], f"the attention probabilities are read by {', '.join(readers)}, not "
                                        "only by the MatMul with V (of guards, only Where(IsNaN(p), 0, p))")
        return None
    v = heads(ix, out_mm.input[1])
    for part in (q, k, v):
        if isinstance(part, str):
            return Reject(ID, [anchor], part)
    if not (isinstance(q, Heads) and isinstance(k, Heads) and isinstance(v, Heads)):
        return None
    x = q.proj.x
    h, d = q.heads, q.size
    sizes = Sizes(ix, x)
    sizes.split(h, d)
    merged = merge_heads(ix, out_mm.output[0], sizes)
    if merged is None:
        return None
    if isinstance(merged, str):
        return Reject(ID, [anchor], merged)
    tail_nodes, output, out_targets = merged
    core = (q.nodes + q.proj.nodes + k.nodes + k.proj.nodes + v.nodes + v.proj.nodes + [mm] + scale_nodes
            + ([pre] if pre is not None else []) + [anchor] + guard + [out_mm] + tail_nodes)
    core = list({id(n): n for n in core}.values())  # a packed projection is Q's, K's and V's
    nodes = core + shape_nodes(ix, [*q.targets, *k.targets, *v.targets, *out_targets], core)
    hidden = h * d
    problem = ""
    if k.proj.x != x or v.proj.x != x:
        problem = "Q, K and V are projections of different tensors (not self-attention)"
    elif (k.heads, k.size, v.heads, v.size) != (h, d, h, d):
        problem = f"Q, K and V are split into different heads ({h}x{d}, {k.heads}x{k.size}, {v.heads}x{v.size})"
    elif q.proj.w.shape[0] != hidden or q.proj.w.shape != k.proj.w.shape or q.proj.w.shape != v.proj.w.shape:
        problem = f"the projections are not all [{hidden}, {hidden}]"
    shape = ix.shape(x)
    if not problem and (shape is None or len(shape) != 3):
        problem = f"input '{x}' is not known to be [batch, seq, hidden]: ORT's attention ops take rank 3"
    problem = (problem or (mask and _mask_problem(ix, mask, h)) or float32_problem(ix, x, output)
               or intermediate_problem(ix, nodes, output))
    if problem:
        return Reject(ID, nodes, problem)
    raw = padding_mask(ix, mask) if mask else None
    base = f"{ix.name_of(anchor)}_fused"
    w = np.concatenate([q.proj.w, k.proj.w, v.proj.w], axis=1).astype(np.float32)
    b = np.concatenate([q.proj.b, k.proj.b, v.proj.b]).astype(np.float32)
    inits = [numpy_helper.from_array(w, ix.unique_name(f"{base}_W")),
             numpy_helper.from_array(b, ix.unique_name(f"{base}_B"))]
    if not mask:  # no mask: a zero additive mask [1, 1, 1, 1], which the lowering forms leave out
        inits.append(numpy_helper.from_array(np.zeros((1, 1, 1, 1), np.float32), ix.unique_name(f"{base}_no_mask")))
        mask = inits[-1].name
    attrs = {"num_heads": h, "scale": float(scale), "key_padding_mask": raw[0] if raw else "",
             "mask_filter_value": float(raw[1]) if raw else 0.0,
             # a guard after a finite mask (or none) never sees a NaN from finite inputs: not reproduced
             "nan_to_zero": int(bool(guard) and not finite_mask(ix, mask))}
    return Match(ID, "FusedAttention", nodes, [x, inits[0].name, inits[1].name, mask], output, attrs, inits)


def core_reference(qkv, bias, mask, num_heads: int, scale: float, **_):
    """The attention of the packed projection ``qkv`` = x @ W (bias not added), in float64."""
    batch, seq, width = qkv.shape
    size = width // (3 * num_heads)
    t = qkv.astype(np.float64) + bias.astype(np.float64)
    q, k, v = (x.reshape(batch, seq, num_heads, size).transpose(0, 2, 1, 3) for x in np.split(t, 3, axis=-1))
    scores = q @ k.transpose(0, 1, 3, 2) * scale + mask.astype(np.float64)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    return (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, num_heads * size).astype(np.float32)


def zero_nans(x, **_):
    """x with every NaN entry +0 (Where(IsNaN(x), 0, x))."""
    return np.where(np.isnan(x), np.float32(0.0), x)


def reference(x, w, b, mask, num_heads: int, scale: float, nan_to_zero: int = 0, **_):
    """softmax(Q K^T * scale + mask) V per head, heads merged; Q|K|V = x @ w + b, in float64; with
    ``nan_to_zero`` the NaN entries (rows whose every key the mask sets to -inf) are 0."""
    with np.errstate(invalid="ignore"):
        out = core_reference(x.astype(np.float64) @ w.astype(np.float64), b, mask, num_heads, scale)
    return zero_nans(out) if nan_to_zero else out


# FusedAttention(X[B, S, D], W[D, 3D], B[3D], M[B|1, H|1, S|1, S]; num_heads, scale, key_padding_mask,
# mask_filter_value, nan_to_zero) = the attention above; key_padding_mask names the [B, S] mask M was
# built from; nan_to_zero: NaN outputs are 0 (the graph's Where(IsNaN(p), 0, p) after the Softmax).
SPEC = OpSpec("FusedAttention", ID, ("X", "W", "B", "M"),
              {"num_heads": int, "scale": float, "key_padding_mask": str, "mask_filter_value": float,
               "nan_to_zero": int}, reference)


# FusedAttentionCore(QKV[B, S, 3D] = x @ W, Bias[3D], M; num_heads, scale): the attention after the
# projection, the native core of the ``native_core`` form.
CORE_SPEC = OpSpec(CORE_OP, ID, ("QKV", "Bias", "M"), {"num_heads": int, "scale": float}, core_reference)


# FusedNanToZero(X) = Where(IsNaN(X), 0, X): the guard of the forms, one native pass where it exists.
GUARD_SPEC = OpSpec(GUARD_OP, ID, ("X",), {}, zero_nans)


# ------------------------------------------------------------------------------------------------
# lowering forms. com.microsoft:Attention(input[B, S, D], weights[D, 3D], bias[3D], mask_index,
# past, attention_bias[B|1, H|1, S, S]) and com.microsoft:MultiHeadAttention(q, k, v [B, S, D],
# bias[3D], key_padding_mask, attention_bias): attention_bias must have the full [S, S]; a
# key_padding_mask / mask_index int32 [B, S] adds mask_filter_value where it is 0.
# ------------------------------------------------------------------------------------------------
def unmasked(m: Match) -> bool:
    """The match has no mask: its M is the zero [1, 1, 1, 1] initializer the matcher wrote."""
    return any(t.name == m.inputs[3] for t in m.initializers)


def _bias(m: Match, ctx: Context) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    """The additive mask as attention_bias [B|1, H|1, S, S]: M itself when it already has S rows;
    Expand(M, Shape(Transpose(M, [0, 1, 3, 2]))) for a [B, H|1, 1, S] mask (built from M alone, so
    every layer's copy is the same subexpression, which ORT computes once); else Expand(M, [1, 1, S,
    1]) with S read from the input. No input ("") for a match without a mask."""
    mask, x = m.inputs[3], m.inputs[0]
    if unmasked(m):
        return [], [], ""
    m_shape, x_shape = ctx.shape(mask), ctx.shape(x)
    if m_shape and x_shape and m_shape[2] == x_shape[1] and m_shape[2] is not None:
        return [], [], mask
    if m_shape and len(m_shape) == 4 and m_shape[2] == 1 and m_shape[3] != 1:
        column, rows, out = ctx.fresh("mask_column"), ctx.fresh("mask_rows"), ctx.fresh("bias")
        nodes = [node("Transpose", [mask], [column], perm=[0, 1, 3, 2]), node("Shape", [column], [rows]),
                 node("Expand", [mask, rows], [out])]
        return nodes, [], out
    seq, ones, one, dims, out = (ctx.fresh(n) for n in ("seq", "ones", "one", "rows", "bias"))
    index = numpy_helper.from_array(np.array([1], np.int64), ctx.fresh("seq_axis"))
    lead = numpy_helper.from_array(np.array([1, 1], np.int64), ones)
    last = numpy_helper.from_array(np.array([1], np.int64), one)
    shape_of = ctx.fresh("x_shape")
    nodes = [node("Shape", [x], [shape_of]), node("Gather", [shape_of, index.name], [seq], axis=0),
             node("Concat", [ones, seq, one], [dims], axis=0), node("Expand", [mask, dims], [out])]
    return nodes, [index, lead, last], out


def _key_padding(m: Match, ctx: Context) -> tuple[list[onnx.NodeProto], str] | str:
    if unmasked(m):
        return "the attention has no mask (the attention_bias and mha_bias forms run it)"
    if not m.attrs["key_padding_mask"]:
        return "the additive mask is not built from a [batch, seq] attention_mask"
    m32 = ctx.fresh("mask_int32")
    return [node("Cast", [m.attrs["key_padding_mask"]], [m32], to=TensorProto.INT32)], m32


def _common(m: Match) -> dict:
    return {"num_heads": int(m.attrs["num_heads"]), "scale": float(m.attrs["scale"])}


def _output(m: Match, ctx: Context) -> str:
    """The tensor the attention op writes: the match's output, or the one its NaN guard reads."""
    return ctx.fresh("attention") if m.attrs.get("nan_to_zero") else m.output


# op -> Where(IsNaN(y), 0, y): the graph's guard after the Softmax, moved after the op (a probability
# row that is NaN gives a NaN output row, and the graph's 0 row gives 0 @ V = 0 for finite V);
# op -> FusedNanToZero(y) where the native op exists (one pass over y instead of ORT's two)
def _guarded(m: Match, ctx: Context, lowered: Lowered, out: str) -> Lowered:
    if out == m.output:
        return lowered
    if GUARD_OP in ctx.native:
        return Lowered(lowered.nodes + [node(GUARD_OP, [out], [m.output], domain=DOMAIN)], lowered.initializers)
    isnan = ctx.fresh("is_nan")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), ctx.fresh("zero"))
    guard = [node("IsNaN", [out], [isnan]), node("Where", [isnan, zero.name, out], [m.output])]
    return Lowered(lowered.nodes + guard, lowered.initializers + [zero])


# FusedAttention   ->   com.microsoft:Attention(x, W_qkv, b_qkv, attention_bias=M)
def lower_attention_bias(m: Match, ctx: Context) -> Lowered | str:
    pre, inits, bias = _bias(m, ctx)
    inputs = [*m.inputs[:3], "", "", bias] if bias else m.inputs[:3]
    out = _output(m, ctx)
    att = node("Attention", inputs, [out], domain=MS_DOMAIN, **_common(m))
    return _guarded(m, ctx, Lowered(pre + [att], inits), out)


# FusedAttention   ->   com.microsoft:Attention(x, W_qkv, b_qkv, mask_index=int32(attention_mask))
def lower_attention_mask(m: Match, ctx: Context) -> Lowered | str:
    padding = _key_padding(m, ctx)
    if isinstance(padding, str):
        return padding
    pre, m32 = padding
    out = _output(m, ctx)
    att = node("Attention", [*m.inputs[:3], m32], [out], domain=MS_DOMAIN,
               mask_filter_value=float(m.attrs["mask_filter_value"]), **_common(m))
    return _guarded(m, ctx, Lowered(pre + [att]), out)


def _split_qkv(m: Match, ctx: Context) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], list[str]]:
    hidden = int(next(t for t in m.initializers if t.name == m.inputs[1]).dims[0])
    qkv, parts = ctx.fresh("qkv"), [ctx.fresh(n) for n in ("q", "k", "v")]
    if ctx.opset >= 13:
        sizes = numpy_helper.from_array(np.array([hidden] * 3, np.int64), ctx.fresh("qkv_split"))
        split = node("Split", [qkv, sizes.name], parts, axis=-1)
        return [node("MatMul", m.inputs[:2], [qkv]), split], [sizes], parts
    return [node("MatMul", m.inputs[:2], [qkv]), node("Split", [qkv], parts, axis=-1, split=[hidden] * 3)], [], parts


# FusedAttention   ->   MatMul(x, W_qkv) -> Split -> com.microsoft:MultiHeadAttention(q, k, v, b, attention_bias=M)
def lower_mha_bias(m: Match, ctx: Context) -> Lowered | str:
    nodes, inits, (q, k, v) = _split_qkv(m, ctx)
    pre, more, bias = _bias(m, ctx)
    inputs = [q, k, v, m.inputs[2], "", bias] if bias else [q, k, v, m.inputs[2]]
    out = _output(m, ctx)
    mha = node("MultiHeadAttention", inputs, [out], domain=MS_DOMAIN, **_common(m))
    return _guarded(m, ctx, Lowered(nodes + pre + [mha], inits + more), out)


# FusedAttention   ->   MatMul(x, W_qkv) -> Split -> com.microsoft:MultiHeadAttention(q, k, v, b, key_padding_mask)
def lower_mha_mask(m: Match, ctx: Context) -> Lowered | str:
    padding = _key_padding(m, ctx)
    if isinstance(padding, str):
        return padding
    nodes, inits, (q, k, v) = _split_qkv(m, ctx)
    pre, m32 = padding
    out = _output(m, ctx)
    mha = node("MultiHeadAttention", [q, k, v, m.inputs[2], m32], [out], domain=MS_DOMAIN,
               mask_filter_value=float(m.attrs["mask_filter_value"]), **_common(m))
    return _guarded(m, ctx, Lowered(nodes + pre + [mha], inits), out)


# FusedAttention   ->   MatMul(x, W_qkv) -> ai.onnx.contrib:FusedAttentionCore(qkv, b_qkv, M) (native)
def lower_native_core(m: Match, ctx: Context) -> Lowered | str:
    qkv, out = ctx.fresh("qkv"), _output(m, ctx)
    core = node(CORE_OP, [qkv, m.inputs[2], m.inputs[3]], [out], domain=DOMAIN, **_common(m))
    return _guarded(m, ctx, Lowered([node("MatMul", m.inputs[:2], [qkv]), core]), out)


# Static priorities: attention_bias first (one GEMM for Q, K and V, and exact for any mask values);
# the forms reading the raw mask, and the native core (ORT's MatMul, then one pass per head that
# keeps only a block of rows of the scores), only where the per-machine ranking (`ortfuse rank`)
# measures them faster. Decision and measurement: docs/ARCHITECTURE.md §5.
LOWERING = (
    LoweringForm("attention_bias", "FusedAttention", "com.microsoft:Attention(attention_bias)",
                 lower_attention_bias, {"": 30}),
    LoweringForm("attention_mask", "FusedAttention", "com.microsoft:Attention(mask_index)",
                 lower_attention_mask, {"": 26}),
    LoweringForm("mha_bias", "FusedAttention", "MatMul + Split + com.microsoft:MultiHeadAttention(attention_bias)",
                 lower_mha_bias, {"": 24}),
    LoweringForm("mha_mask", "FusedAttention", "MatMul + Split + com.microsoft:MultiHeadAttention(key_padding_mask)",
                 lower_mha_mask, {"": 22}),
    LoweringForm("native_core", "FusedAttention", f"MatMul + native {CORE_OP}", lower_native_core, {"": 20},
                 native_ops={"": CORE_OP}),
)


# ------------------------------------------------------------------------------------------------
# examples: one encoder layer's attention as each exporter writes it, batch 2, seq 8, 2 heads of 4
# ------------------------------------------------------------------------------------------------
B, S, H, D = 2, 8, 2, 4


def _example(style: str = "torchscript", weight_scale: float = 0.5, mask: str = "padding",
             cross: bool = False, probs_out: bool = False) -> onnx.ModelProto:
    """``style`` "torchscript" (Div on the scores, (1 - m) * min mask, Shape-built targets) or
    "dynamo" (Mul(sqrt scale) on Q and K^T, Where mask over an Expand); ``mask`` "padding" (from an
    int64 attention_mask), "rank2" (a float [S, S] input added to the scores) or "none" (Softmax of
    the scaled scores)."""
    hidden = H * D
    rng = np.random.default_rng(7)
    inits = {"min": np.float32(np.finfo(np.float32).min), "one": np.float32(1.0),
             "heads": np.array([-1, H, D], np.int64), "merged": np.array([0, 0, hidden], np.int64),
             "axes": np.array([1, 2], np.int64),
             "root": np.float32(math.sqrt(1.0 / math.sqrt(D))), "sqrt_d": np.float32(math.sqrt(D))}
    nodes = [helper.make_node("Shape", ["x"], ["x_shape"], start=0, end=1)]
    for name in "qkv":
        inits[f"w{name}"] = (rng.standard_normal((hidden, hidden)) * weight_scale).astype(np.float32)
        inits[f"b{name}"] = (0.1 * rng.standard_normal(hidden)).astype(np.float32)
        src = "y" if cross and name != "q" else "x"
        terms = [f"b{name}", f"{name}_mm"] if style == "torchscript" else [f"{name}_mm", f"b{name}"]
        nodes += [helper.make_node("MatMul", [src, f"w{name}"], [f"{name}_mm"]),
                  helper.make_node("Add", terms, [f"{name}_lin"]),
                  helper.make_node("Concat", ["x_shape", "heads"], [f"{name}_target"], axis=0),
                  helper.make_node("Reshape", [f"{name}_lin", f"{name}_target"], [f"{name}_r"]),
                  helper.make_node("Transpose", [f"{name}_r"], [f"{name}_h"], perm=[0, 2, 1, 3])]
    nodes.append(helper.make_node("Transpose", ["k_h"], ["k_t"], perm=[0, 1, 3, 2]))
    if style == "torchscript":
        nodes += [helper.make_node("MatMul", ["q_h", "k_t"], ["qk"]),
                  helper.make_node("Div", ["qk", "sqrt_d"], ["scores"])]
    else:
        nodes += [helper.make_node("Mul", ["q_h", "root"], ["q_s"]), helper.make_node("Mul", ["k_t", "root"], ["k_s"]),
                  helper.make_node("MatMul", ["q_s", "k_s"], ["scores"])]
    inputs = {"x": [B, S, hidden]}
    if cross:
        inputs["y"] = [B, S, hidden]
    dtypes = {}
    if mask == "rank2":
        inputs["bias"] = [S, S]
    elif mask != "none":
        inputs["attention_mask"] = [B, S]
        dtypes["attention_mask"] = TensorProto.INT64
        nodes += [helper.make_node("Unsqueeze", ["attention_mask", "axes"], ["m4"]),
                  helper.make_node("Cast", ["m4"], ["mf"], to=TensorProto.FLOAT),
                  helper.make_node("Sub", ["one", "mf"], ["inverted"])]
        if style == "torchscript":
            nodes.append(helper.make_node("Mul", ["inverted", "min"], ["bias"]))
        else:
            nodes += [helper.make_node("Cast", ["inverted"], ["masked"], to=TensorProto.BOOL),
                      helper.make_node("Where", ["masked", "min", "inverted"], ["bias"])]
    if mask != "none":
        nodes.append(helper.make_node("Add", ["scores", "bias"], ["biased"]))
    nodes += [helper.make_node("Softmax", ["scores" if mask == "none" else "biased"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "v_h"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctx_t", "merged"], ["out"])]
    return _checked(nodes, "attention_example",
                    [helper.make_tensor_value_info(n, dtypes.get(n, TensorProto.FLOAT), s) for n, s in inputs.items()],
                    [helper.make_tensor_value_info("out", TensorProto.FLOAT, [B, S, hidden])]
                    + ([helper.make_tensor_value_info("probs", TensorProto.FLOAT, [B, H, S, S])] if probs_out else []),
                    inits)


def _checked(nodes, name: str, inputs: list, outputs: list, inits: dict, opset: int = 17) -> onnx.ModelProto:
    """An example's graph as a model (IR version 8, or 7 below opset 13) onnx's full check accepts."""
    graph = helper.make_graph(nodes, name, inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="ortfuse-rule-example")
    model.ir_version = 8 if opset >= 13 else 7
    onnx.checker.check_model(model, full_check=True)
    return model


def _sdpa_example(exporter: str = "torchscript", swap: bool = False, guard_fill: float = 0.0,
                  masked: bool = True) -> onnx.ModelProto:
    """One layer's attention as torch exports transformers' BertModel (SDPA): split-heads targets
    Concat(Gather(Shape(x), 0), Gather(Shape(x), 1), [-1], [d]) (``swap``: axes 1 and 0, a different
    Reshape), sqrt-scale Mul on Q and K^T, Where(bool mask, 0, -inf or finfo.min) added to the scores
    (``masked``),
    Where(IsNaN(p), ``guard_fill``, p) after the Softmax, a Reshape of the output to its own shape,
    merge target Concat(.., [-1]). ``exporter`` "torchscript": K^T by Transpose [0, 2, 3, 1], mask
    -inf; "dynamo": K^T through rank 3 (Reshape, Transpose [0, 2, 1], Reshape), mask finfo.min."""
    hidden, rng = H * D, np.random.default_rng(11)
    inits = {"zero": np.float32(0.0), "fill": np.float32(guard_fill), "minus_one": np.array([-1], np.int64),
             "head": np.array([D], np.int64), "axis0": np.array([0], np.int64), "mask_axes": np.array([1, 2], np.int64),
             "root": np.float32(math.sqrt(1.0 / math.sqrt(D))), "i0": np.int64(0), "i1": np.int64(1),
             "i2": np.int64(2), "i3": np.int64(3), "last": np.array([-1], np.int64), "end": np.array([2**63 - 1]),
             "second": np.array([-2], np.int64), "begin": np.array([-(2**63)]),
             "min": np.float32(-np.inf if exporter == "torchscript" else np.finfo(np.float32).min)}

    def dim(g: list, tensor: str, index: str, out: str) -> str:
        g += [helper.make_node("Shape", [tensor], [f"{out}_shape"]),
              helper.make_node("Gather", [f"{out}_shape", index], [f"{out}_scalar"], axis=0),
              helper.make_node("Unsqueeze", [f"{out}_scalar", "axis0"], [out])]
        return out

    nodes: list[onnx.NodeProto] = []
    lead = [dim(nodes, "x", "i0", "batch"), dim(nodes, "x", "i1", "seq")]
    lead = lead[::-1] if swap else lead
    nodes.append(helper.make_node("Concat", [*lead, "minus_one", "head"], ["split_target"], axis=0))
    for name in "qkv":
        inits[f"w{name}"] = (rng.standard_normal((hidden, hidden)) * 0.5).astype(np.float32)
        inits[f"b{name}"] = (0.1 * rng.standard_normal(hidden)).astype(np.float32)
        nodes += [helper.make_node("MatMul", ["x", f"w{name}"], [f"{name}_mm"]),
                  helper.make_node("Add", [f"b{name}", f"{name}_mm"], [f"{name}_lin"]),
                  helper.make_node("Reshape", [f"{name}_lin", "split_target"], [f"{name}_r"])]
        if name != "k" or exporter == "dynamo":
            nodes.append(helper.make_node("Transpose", [f"{name}_r"], [f"{name}_h"], perm=[0, 2, 1, 3]))
    if exporter == "torchscript":
        nodes.append(helper.make_node("Transpose", ["k_r"], ["k_t"], perm=[0, 2, 3, 1]))
    else:
        nodes += [helper.make_node("Shape", ["k_h"], ["k_shape"]),
                  helper.make_node("Slice", ["k_shape", "last", "end"], ["k_last"]),
                  helper.make_node("Slice", ["k_shape", "second", "last"], ["k_second"]),
                  helper.make_node("Slice", ["k_shape", "begin", "second"], ["k_lead"]),
                  helper.make_node("Concat", ["minus_one", "k_second", "k_last"], ["k3_target"], axis=0),
                  helper.make_node("Reshape", ["k_h", "k3_target"], ["k3"]),
                  helper.make_node("Transpose", ["k3"], ["k3_t"], perm=[0, 2, 1]),
                  helper.make_node("Concat", ["k_lead", "k_last", "k_second"], ["kt_target"], axis=0),
                  helper.make_node("Reshape", ["k3_t", "kt_target"], ["k_t"])]
    nodes += [helper.make_node("Mul", ["q_h", "root"], ["q_s"]), helper.make_node("Mul", ["k_t", "root"], ["k_s"]),
              helper.make_node("MatMul", ["q_s", "k_s"], ["scores"])]
    if masked:
        nodes += [helper.make_node("Unsqueeze", ["attention_mask", "mask_axes"], ["m4"]),
                  helper.make_node("Cast", ["m4"], ["keep"], to=TensorProto.BOOL),
                  helper.make_node("Where", ["keep", "zero", "min"], ["bias"]),
                  helper.make_node("Add", ["scores", "bias"], ["biased"])]
    nodes += [helper.make_node("Softmax", ["biased" if masked else "scores"], ["probs"], axis=-1),
              helper.make_node("IsNaN", ["probs"], ["probs_nan"]),
              helper.make_node("Where", ["probs_nan", "fill", "probs"], ["probs_guarded"]),
              helper.make_node("MatMul", ["probs_guarded", "v_h"], ["ctx"])]
    same = [dim(nodes, "ctx", "i0", "ctx_batch"), "minus_one", dim(nodes, "q_h", "i2", "ctx_seq"),
            dim(nodes, "v_h", "i3", "ctx_head")]
    nodes += [helper.make_node("Concat", same, ["same_target"], axis=0),
              helper.make_node("Reshape", ["ctx", "same_target"], ["ctx_same"]),
              helper.make_node("Transpose", ["ctx_same"], ["ctx_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Concat", [*lead, "minus_one"], ["merge_target"], axis=0),
              helper.make_node("Reshape", ["ctx_t", "merge_target"], ["out"])]
    return _checked(nodes, "sdpa_example",
                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, hidden])]
                    + ([helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [B, S])] if masked else []),
                    [helper.make_tensor_value_info("out", TensorProto.FLOAT, [B, S, hidden])], inits)


def _packed_example(three: int = 3) -> onnx.ModelProto:
    """ViT-style attention as paddle2onnx writes PP-OCR's SVTR neck (opset 12): one Linear for Q, K
    and V; Reshape to [0, S, 3, H, d] with S read as Slice(Cast(Shape(x), int32)) and every entry
    Cast to int64; Transpose [2, 0, 3, 1, 4]; Q, K, V as Squeeze(Slice(.., axis 0)); the scale on Q;
    K^T by Transpose; heads merged by Reshape to [0, S, D]. ``three``: the target's entry before H
    (-1 is a valid Reshape the rule does not prove)."""
    hidden, rng = H * D, np.random.default_rng(13)
    inits = {"w": (rng.standard_normal((hidden, 3 * hidden)) * 0.5).astype(np.float32),
             "b": (0.1 * rng.standard_normal(3 * hidden)).astype(np.float32),
             "scale": np.float32(D ** -0.5), "zero": np.array([0], np.int32), "three": np.array([three], np.int32),
             "h": np.array([H], np.int32), "d": np.array([D], np.int32), "width": np.array([hidden], np.int32)}
    inits |= {f"i{i}": np.array([i], np.int64) for i in range(4)}  # Slice starts, ends, axis 0 and step 1

    def cast(name: str, target: str) -> str:
        nodes.append(helper.make_node("Cast", [name], [f"{target}_{name}"], to=TensorProto.INT64))
        return f"{target}_{name}"

    nodes = [helper.make_node("Shape", ["x"], ["x_shape"]),
             helper.make_node("Cast", ["x_shape"], ["x_shape32"], to=TensorProto.INT32),
             helper.make_node("Slice", ["x_shape32", "i1", "i2", "i0", "i1"], ["seq32"]),
             helper.make_node("MatMul", ["x", "w"], ["qkv_mm"]),
             helper.make_node("Add", ["qkv_mm", "b"], ["qkv"])]
    split = [cast(t, "split") for t in ("zero", "seq32", "three", "h", "d")]
    nodes += [helper.make_node("Concat", split, ["split_target"], axis=0),
              helper.make_node("Reshape", ["qkv", "split_target"], ["qkv5"]),
              helper.make_node("Transpose", ["qkv5"], ["parts"], perm=[2, 0, 3, 1, 4])]
    for i, name in enumerate("qkv"):
        nodes += [helper.make_node("Slice", ["parts", f"i{i}", f"i{i + 1}", "i0", "i1"], [f"{name}_1"]),
                  helper.make_node("Squeeze", [f"{name}_1"], [f"{name}_h"], axes=[0])]
    nodes += [helper.make_node("Mul", ["q_h", "scale"], ["q_s"]),
              helper.make_node("Transpose", ["k_h"], ["k_t"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q_s", "k_t"], ["scores"]),
              helper.make_node("Softmax", ["scores"], ["probs"], axis=3),
              helper.make_node("MatMul", ["probs", "v_h"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3])]
    merge = [cast(t, "merge") for t in ("zero", "seq32", "width")]
    nodes += [helper.make_node("Concat", merge, ["merge_target"], axis=0),
              helper.make_node("Reshape", ["ctx_t", "merge_target"], ["out"])]
    return _checked(nodes, "packed_attention_example",
                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, hidden])],
                    [helper.make_tensor_value_info("out", TensorProto.FLOAT, [B, S, hidden])], inits, opset=12)


RULE = PatternRule(
    anchor=Anchor("Softmax", onnx_only=True),
    id=ID, order=5, matcher=match, specs=(SPEC, CORE_SPEC, GUARD_SPEC), lowering=LOWERING,
    examples=(
        Example("torchscript_bert_attention", _example),
        Example("dynamo_sdpa_attention", lambda: _example("dynamo")),
        Example("large_scores", lambda: _example("dynamo", weight_scale=4.0)),
        Example("no_mask", lambda: _example(mask="none")),
        Example("rank2_float_mask", lambda: _example(mask="rank2"),
                reason="has rank 2, not the [batch, 1 or heads, seq, seq] of a padding mask"),
        Example("cross_attention", lambda: _example(cross=True), reason="projections of different tensors"),
        Example("probs_are_an_output", lambda: _example(probs_out=True),
                reason="intermediate tensor 'probs' is a graph output"),
        Example("torchscript_sdpa_attention", _sdpa_example),
        Example("dynamo_sdpa_attention_key_through_rank3", lambda: _sdpa_example("dynamo")),
        Example("sdpa_batch_and_seq_swapped", lambda: _sdpa_example(swap=True, masked=False),
                reason="entry 0 of its target (dim 1 of 'x') is not provably the batch"),
        Example("vit_packed_qkv_attention", _packed_example),
        Example("packed_qkv_three_as_minus_one", lambda: _packed_example(three=-1),
                reason="the packed projection's Reshape target is not [batch, seq, 3, heads, head size]"),
        Example("sdpa_guard_fills_one", lambda: _sdpa_example(guard_fill=1.0),
                reason="the attention probabilities are read by IsNaN, Where, not only by the MatMul with V"),
    ),
)
