"""An all-MiniLM-L6-v2-like BERT encoder as torch's TorchScript exporter writes it at opset 14.

Inputs ``input_ids``, ``token_type_ids``, ``attention_mask``: int64 ``[batch, seq]``; output
``last_hidden_state[batch, seq, 384]``. 6 post-LN layers, hidden 384, 12 heads of 32, FFN 1536,
vocabulary 30522, 512 positions, 2 token types: a ``token_type_ids`` value outside ``[0, 2)`` makes
the token-type Gather index out of range, and ORT fails the run.

    embeddings  Gather(word, input_ids) + Gather(token_type, token_type_ids) + Gather(position,
                Slice(position_ids[1, 512], 0, Shape(input_ids)[1])), decomposed LayerNorm
    mask        (1 - Cast(Unsqueeze(Unsqueeze(attention_mask, 1), 2))) * finfo(float32).min
    attention   MatMul + Add(bias, .) for Q, K, V; Reshape to [B, S, 12, 32] with the target built
                from Shape -> Gather -> Unsqueeze -> Concat; Transpose; K transposed again; MatMul,
                Div(sqrt 32), Add(mask), Softmax, MatMul V, Transpose, Reshape to [B, S, 384];
                MatMul + Add, residual Add, LayerNorm
    FFN         MatMul + Add, erf-Gelu (Div sqrt 2, Erf, Add 1, Mul x, Mul 0.5), MatMul + Add,
                residual Add, LayerNorm

LayerNorm is ReduceMean -> Sub -> Pow(2) -> ReduceMean -> Add(1e-12) -> Sqrt -> Div -> Mul -> Add
(opset 14 has no LayerNormalization op). Linear biases come first in their Add, as the exporter
writes ``Add(bias, MatMul(x, W))``.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto

from .builder import GraphBuilder
from .layers import erf_gelu, layer_norm

SEED = 384
OPSET = 14
VOCAB = 30522
POSITIONS = 512
TOKEN_TYPES = 2
LAYERS = 6
HIDDEN = 384
HEADS = 12
HEAD = HIDDEN // HEADS
FFN = 1536
INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def _linear(g: GraphBuilder, x: str, cin: int, cout: int) -> str:
    """``Add(bias, MatMul(x, W[cin, cout]))``."""
    w = (g.rng.standard_normal((cin, cout)) * math.sqrt(1.0 / cin)).astype(np.float32)
    b = (0.02 * g.rng.standard_normal(cout)).astype(np.float32)
    y = g.op("MatMul", [x, g.weight("weight", w)])
    return g.op("Add", [g.weight("bias", b), y])


def _dim(g: GraphBuilder, x: str, axis: int) -> str:
    """``[x.shape[axis]]`` as a 1-element int64 tensor: Shape -> Gather(scalar) -> Unsqueeze."""
    index = g.weight("index", np.array(axis, dtype=np.int64))
    return g.op("Unsqueeze", [g.op("Gather", [g.op("Shape", [x]), index], axis=0), g.ints([0], "axes")])


def _embeddings(g: GraphBuilder, ids: str, types: str) -> str:
    rng = g.rng
    word = g.weight("word_embeddings.weight", (0.05 * rng.standard_normal((VOCAB, HIDDEN))).astype(np.float32))
    position = g.weight(
        "position_embeddings.weight", (0.02 * rng.standard_normal((POSITIONS, HIDDEN))).astype(np.float32)
    )
    token_type = g.weight(
        "token_type_embeddings.weight", (0.05 * rng.standard_normal((TOKEN_TYPES, HIDDEN))).astype(np.float32)
    )
    position_ids = g.weight("position_ids", np.arange(POSITIONS, dtype=np.int64)[None, :])
    seq = _dim(g, ids, 1)
    positions = g.op("Slice", [position_ids, g.ints([0], "starts"), seq, g.ints([1], "axes"), g.ints([1], "steps")])
    x = g.op("Add", [g.op("Gather", [word, ids], axis=0), g.op("Gather", [token_type, types], axis=0)])
    x = g.op("Add", [x, g.op("Gather", [position, positions], axis=0)])
    with g.scope("LayerNorm"):
        return layer_norm(g, x, HIDDEN)


def _extended_mask(g: GraphBuilder, mask: str) -> str:
    """``(1 - mask[:, None, None, :]) * finfo(float32).min`` as the exporter writes it."""
    m = g.op("Unsqueeze", [mask, g.ints([1], "axes")])
    m = g.op("Unsqueeze", [m, g.ints([2], "axes")])
    m = g.op("Cast", [m], to=TensorProto.FLOAT)
    m = g.op("Sub", [g.scalar(1.0), m])
    return g.op("Mul", [m, g.scalar(float(np.finfo(np.float32).min))])


def _heads(g: GraphBuilder, x: str) -> str:
    """[B, S, 384] -> [B, 12, S, 32]: Reshape to a target built from ``x``'s Shape, Transpose."""
    target = g.op("Concat", [_dim(g, x, 0), _dim(g, x, 1), g.ints([HEADS]), g.ints([HEAD])], axis=0)
    return g.op("Transpose", [g.op("Reshape", [x, target])], perm=[0, 2, 1, 3])


def _attention(g: GraphBuilder, x: str, mask: str) -> str:
    proj = {}
    for name in ("query", "key", "value"):
        with g.scope(name):
            proj[name] = _heads(g, _linear(g, x, HIDDEN, HIDDEN))
    k = g.op("Transpose", [proj["key"]], perm=[0, 1, 3, 2])
    scores = g.op("Div", [g.op("MatMul", [proj["query"], k]), g.scalar(math.sqrt(HEAD))])
    probs = g.op("Softmax", [g.op("Add", [scores, mask])], axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [probs, proj["value"]])], perm=[0, 2, 1, 3])
    target = g.op("Concat", [_dim(g, ctx, 0), _dim(g, ctx, 1), g.ints([HIDDEN])], axis=0)
    return g.op("Reshape", [ctx, target])


def _layer(g: GraphBuilder, x: str, mask: str) -> str:
    with g.scope("attention"):
        with g.scope("self"):
            a = _attention(g, x, mask)
        with g.scope("output"):
            a = _linear(g, a, HIDDEN, HIDDEN)
            with g.scope("LayerNorm"):
                x = layer_norm(g, g.op("Add", [a, x]), HIDDEN)
    with g.scope("intermediate"):
        h = erf_gelu(g, _linear(g, x, HIDDEN, FFN))
    with g.scope("output"):
        h = _linear(g, h, FFN, HIDDEN)
        with g.scope("LayerNorm"):
            return layer_norm(g, g.op("Add", [h, x]), HIDDEN)


def make() -> onnx.ModelProto:
    """Build the encoder with initializer weights, opset 14."""
    g = GraphBuilder("minilm_encoder", SEED, opset=OPSET)
    ids, types, mask = (g.input(name, ["batch", "seq"], TensorProto.INT64) for name in INPUTS)
    with g.scope("embeddings"):
        x = _embeddings(g, ids, types)
    with g.scope("encoder"):
        extended = _extended_mask(g, mask)
        for i in range(LAYERS):
            with g.scope(f"layer.{i}"):
                x = _layer(g, x, extended)
    g.output(x, "last_hidden_state", ["batch", "seq", HIDDEN])
    return g.model()
