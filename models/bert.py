"""A BERT-base-sized encoder: 4 post-LN layers, hidden 768, 12 heads, FFN 3072.

Input ``hidden_states[batch, seq, 768]``, output ``output[batch, seq, 768]``; no mask.
Attention as MatMul+Add projections, Reshape/Transpose into heads, MatMul, Div(sqrt(d)),
Softmax, MatMul, Transpose/Reshape back; FFN as 3-D MatMul + Add + erf-Gelu (exporter
order) + MatMul + Add; residual Adds and decomposed LayerNorm after each sub-layer.
"""

from __future__ import annotations

import math

import onnx

from .builder import GraphBuilder
from .layers import erf_gelu, layer_norm, linear

SEED = 768
LAYERS = 4
HIDDEN = 768
HEADS = 12
FFN = 3072
INIT_STD = 0.02  # BERT's initializer range


def _attention(g: GraphBuilder, x: str) -> str:
    head = HIDDEN // HEADS
    proj = {}
    for name in ("query", "key", "value"):
        with g.scope(name):
            proj[name] = g.op("Reshape", [linear(g, x, HIDDEN, HIDDEN, INIT_STD), g.ints([0, 0, HEADS, head])])
    q = g.op("Transpose", [proj["query"]], perm=[0, 2, 1, 3])  # [b, h, s, d]
    k = g.op("Transpose", [proj["key"]], perm=[0, 2, 3, 1])  # [b, h, d, s]
    v = g.op("Transpose", [proj["value"]], perm=[0, 2, 1, 3])
    scores = g.op("Div", [g.op("MatMul", [q, k]), g.scalar(math.sqrt(head))])
    ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), g.ints([0, 0, HIDDEN])])
    with g.scope("output"):
        return linear(g, ctx, HIDDEN, HIDDEN, INIT_STD)


def _layer(g: GraphBuilder, x: str) -> str:
    with g.scope("attention"):
        a = _attention(g, x)
    with g.scope("attention_norm"):
        x = layer_norm(g, g.op("Add", [a, x]), HIDDEN)
    with g.scope("intermediate"):
        h = erf_gelu(g, linear(g, x, HIDDEN, FFN, INIT_STD))
    with g.scope("output"):
        h = linear(g, h, FFN, HIDDEN, INIT_STD)
    with g.scope("output_norm"):
        return layer_norm(g, g.op("Add", [h, x]), HIDDEN)


def make() -> onnx.ModelProto:
    """Build the encoder with initializer weights."""
    g = GraphBuilder("bert_encoder", SEED)
    x = g.input("hidden_states", ["batch", "seq", HIDDEN])
    for i in range(LAYERS):
        with g.scope(f"layer{i}"):
            x = _layer(g, x)
    g.output(x, "output", ["batch", "seq", HIDDEN])
    return g.model()
