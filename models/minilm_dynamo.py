"""The all-MiniLM-L6-v2-like encoder of ``minilm.py`` as torch's dynamo exporter writes it at opset 18
(``torch.onnx.export(..., dynamo=True)``, torch's default exporter, with its graph optimizer).

Inputs ``input_ids``, ``token_type_ids``, ``attention_mask``: int64 ``[batch, seq]``; output
``last_hidden_state[batch, seq, 384]``. Same sizes as ``minilm``: 6 post-LN layers, hidden 384,
12 heads of 32, FFN 1536, vocabulary 30522, 512 positions, 2 token types. The node patterns are the
ones the exporter's ATen decompositions (torchlib) write for a Hugging Face BERT with SDPA attention:

    embeddings  Gather(word, input_ids) + Gather(token_type, token_type_ids) + Gather(position,
                Slice(position_ids[1, 512], 0, Shape(input_ids, start=1, end=2))), LayerNormalization
    mask        Unsqueeze(attention_mask, [1, 2]) -> Expand([B, 1, S, S]) -> Cast(float) -> Sub(1, .)
                -> Where(Cast(bool), finfo(float32).min, .)    (HF's 4-D mask for SDPA)
    attention   MatMul(x, W) + Add(., bias) for Q, K, V; Reshape to [B, -1, 12, 32] (target: Concat of
                Shape(x, start=0, end=1) and constants); Transpose [0, 2, 1, 3]; SDPA with a float mask:
                Mul(Q, sqrt(scale)), Transpose(K, [0, 1, 3, 2]) -> Mul(sqrt(scale)), MatMul, Add(mask),
                Softmax(-1), MatMul V; Transpose [0, 2, 1, 3]; Reshape to [B, -1, 384]; MatMul + Add,
                residual Add, LayerNormalization
    FFN         MatMul + Add, erf-Gelu (Div sqrt 2, Erf, Add 1, Mul 0.5, Mul x), MatMul + Add,
                residual Add, LayerNormalization

``scale`` is SDPA's default 1 / sqrt(32); the exporter's optimizer folds Sqrt(scale) into one
constant, used by both Muls. Linear weights are stored transposed to [in, out] (the folded
Transpose of ``aten.linear``) and the bias comes second in its Add. Every intermediate tensor has
its value_info with symbolic dims ``batch`` and ``seq``, as the exporter writes them.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto

from .builder import GraphBuilder
from .minilm import FFN, HEAD, HEADS, HIDDEN, INPUTS, LAYERS, POSITIONS, TOKEN_TYPES, VOCAB

SEED = 385
OPSET = 18
EPS = 1e-12


def _linear(g: GraphBuilder, x: str, cin: int, cout: int) -> str:
    """``Add(MatMul(x, W[cin, cout]), bias)``."""
    w = (g.rng.standard_normal((cin, cout)) * math.sqrt(1.0 / cin)).astype(np.float32)
    b = (0.02 * g.rng.standard_normal(cout)).astype(np.float32)
    return g.op("Add", [g.op("MatMul", [x, g.weight("weight", w)]), g.weight("bias", b)])


def _layer_norm(g: GraphBuilder, x: str) -> str:
    """The LayerNormalization op over the last axis, with weight near 1 and bias near 0."""
    scale = (1.0 + 0.05 * g.rng.standard_normal(HIDDEN)).astype(np.float32)
    bias = (0.02 * g.rng.standard_normal(HIDDEN)).astype(np.float32)
    return g.op("LayerNormalization", [x, g.weight("weight", scale), g.weight("bias", bias)], axis=-1, epsilon=EPS)


def _gelu(g: GraphBuilder, x: str) -> str:
    """torchlib's erf-Gelu: Div(x, sqrt 2) -> Erf -> Add(1) -> Mul(0.5, .) -> Mul(x, .)."""
    t = g.op("Erf", [g.op("Div", [x, g.scalar(math.sqrt(2.0))])])
    t = g.op("Mul", [g.scalar(0.5), g.op("Add", [t, g.scalar(1.0)])])
    return g.op("Mul", [x, t])


def _embeddings(g: GraphBuilder, ids: str, types: str) -> tuple[str, dict[str, list]]:
    """The embeddings' output, and the dims of the position ids and their embeddings (1 row)."""
    rng = g.rng
    word = g.weight("word_embeddings.weight", (0.05 * rng.standard_normal((VOCAB, HIDDEN))).astype(np.float32))
    position = g.weight(
        "position_embeddings.weight", (0.02 * rng.standard_normal((POSITIONS, HIDDEN))).astype(np.float32)
    )
    token_type = g.weight(
        "token_type_embeddings.weight", (0.05 * rng.standard_normal((TOKEN_TYPES, HIDDEN))).astype(np.float32)
    )
    position_ids = g.weight("position_ids", np.arange(POSITIONS, dtype=np.int64)[None, :])
    seq = g.op("Shape", [ids], start=1, end=2)
    positions = g.op("Slice", [position_ids, g.ints([0], "starts"), seq, g.ints([1], "axes"), g.ints([1], "steps")])
    x = g.op("Add", [g.op("Gather", [word, ids], axis=0), g.op("Gather", [token_type, types], axis=0)])
    gathered = g.op("Gather", [position, positions], axis=0)
    x = g.op("Add", [x, gathered])
    with g.scope("LayerNorm"):
        return _layer_norm(g, x), {positions: [1, "seq"], gathered: [1, "seq", HIDDEN]}


def _extended_mask(g: GraphBuilder, mask: str) -> str:
    """HF's SDPA mask: ``(1 - mask[:, None, None, :].expand(B, 1, S, S))`` with the masked places
    set to finfo(float32).min by ``masked_fill``, as Expand, Cast, Sub, Cast(bool), Where."""
    m = g.op("Unsqueeze", [mask, g.ints([1, 2], "axes")])
    batch = g.op("Shape", [mask], start=0, end=1)
    seq = g.op("Shape", [mask], start=1, end=2)
    m = g.op("Expand", [m, g.op("Concat", [batch, g.ints([1]), seq, seq], axis=0)])
    inverted = g.op("Sub", [g.scalar(1.0), g.op("Cast", [m], to=TensorProto.FLOAT)])
    masked = g.op("Cast", [inverted], to=TensorProto.BOOL)
    return g.op("Where", [masked, g.scalar(float(np.finfo(np.float32).min)), inverted])


def _heads(g: GraphBuilder, x: str, batch: str) -> str:
    """[B, S, 384] -> [B, 12, S, 32]: ``view(B, -1, 12, 32).transpose(1, 2)``."""
    target = g.op("Concat", [batch, g.ints([-1, HEADS, HEAD])], axis=0)
    return g.op("Transpose", [g.op("Reshape", [x, target])], perm=[0, 2, 1, 3])


def _attention(g: GraphBuilder, x: str, mask: str) -> str:
    batch = g.op("Shape", [x], start=0, end=1)
    proj = {}
    for name in ("query", "key", "value"):
        with g.scope(name):
            proj[name] = _heads(g, _linear(g, x, HIDDEN, HIDDEN), batch)
    root = g.scalar(math.sqrt(1.0 / math.sqrt(HEAD)), "scale_sqrt")
    q = g.op("Mul", [proj["query"], root])
    k = g.op("Mul", [g.op("Transpose", [proj["key"]], perm=[0, 1, 3, 2]), root])
    probs = g.op("Softmax", [g.op("Add", [g.op("MatMul", [q, k]), mask])], axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [probs, proj["value"]])], perm=[0, 2, 1, 3])
    return g.op("Reshape", [ctx, g.op("Concat", [batch, g.ints([-1, HIDDEN])], axis=0)])


def _layer(g: GraphBuilder, x: str, mask: str) -> str:
    with g.scope("attention"):
        with g.scope("self"):
            a = _attention(g, x, mask)
        with g.scope("output"):
            a = _linear(g, a, HIDDEN, HIDDEN)
            with g.scope("LayerNorm"):
                x = _layer_norm(g, g.op("Add", [a, x]))
    with g.scope("intermediate"):
        h = _gelu(g, _linear(g, x, HIDDEN, FFN))
    with g.scope("output"):
        h = _linear(g, h, FFN, HIDDEN)
        with g.scope("LayerNorm"):
            return _layer_norm(g, g.op("Add", [h, x]))


def make() -> onnx.ModelProto:
    """Build the encoder with initializer weights, opset 18."""
    g = GraphBuilder("minilm_encoder_dynamo", SEED, opset=OPSET)
    ids, types, mask = (g.input(name, ["batch", "seq"], TensorProto.INT64) for name in INPUTS)
    with g.scope("embeddings"):
        x, position_dims = _embeddings(g, ids, types)
    with g.scope("encoder"):
        extended = _extended_mask(g, mask)
        for i in range(LAYERS):
            with g.scope(f"layer.{i}"):
                x = _layer(g, x, extended)
    g.output(x, "last_hidden_state", ["batch", "seq", HIDDEN])
    return _with_value_info(g.model(), position_dims)


def _with_value_info(model: onnx.ModelProto, fixed: dict[str, list]) -> onnx.ModelProto:
    """Type every intermediate tensor with symbolic dims, as the exporter does: ONNX shape inference
    (with data propagation) gives the static dims; a dynamic first dim is ``batch`` and any other
    dynamic dim ``seq`` (every dynamic dim of this network is one of the two); ``fixed`` gives the
    dims of the tensors that break that rule."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    for info in inferred.graph.value_info:
        for axis, dim in enumerate(info.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value"):
                dim.dim_param = "batch" if axis == 0 else "seq"
        for dim, size in zip(info.type.tensor_type.shape.dim, fixed.get(info.name, ())):
            if isinstance(size, int):
                dim.dim_value = size
            else:
                dim.dim_param = size
    model.graph.value_info.extend(inferred.graph.value_info)
    return model
