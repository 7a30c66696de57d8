"""A Gemm MLP with Relu and Gelu epilogues: input ``input[batch, 512]``, output ``output[batch, 512]``.

Four blocks, each Gemm(512 -> 1024) -> act1 -> Gemm(1024 -> 512) -> act2 (Gemm bias as
input C; ``transB`` 1 is PyTorch's Linear form [out, in], 0 stores W as [in, out]):

    block 0  transB=1  Relu                      | erf-Gelu
    block 1  transB=1  erf-Gelu                  | Relu
    block 2  transB=0  tanh-Gelu                 | Relu
    block 3  transB=0  Relu -> erf-Gelu          | none (plain Gemm output)

erf-Gelu is Div(sqrt 2) -> Erf -> Add(1) -> Mul(x) -> Mul(0.5); tanh-Gelu is the HF
``gelu_new`` export order (see ``layers.tanh_gelu``).
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from .builder import GraphBuilder
from .layers import erf_gelu, tanh_gelu

SEED = 512
WIDTH = 512
INNER = 1024
# (transB, epilogue after the first Gemm, epilogue after the second Gemm)
BLOCKS = (
    (1, ("relu",), ("erf_gelu",)),
    (1, ("erf_gelu",), ("relu",)),
    (0, ("tanh_gelu",), ("relu",)),
    (0, ("relu", "erf_gelu"), ()),
)


def _act(g: GraphBuilder, x: str, kind: str) -> str:
    if kind == "relu":
        return g.op("Relu", [x])
    return {"erf_gelu": erf_gelu, "tanh_gelu": tanh_gelu}[kind](g, x)


def _gemm(g: GraphBuilder, x: str, cin: int, cout: int, trans_b: int) -> str:
    w = (g.rng.standard_normal((cin, cout)) * math.sqrt(2.0 / cin)).astype(np.float32)
    b = (0.02 * g.rng.standard_normal(cout)).astype(np.float32)
    w = g.weight("weight", w.T if trans_b else w)
    return g.op("Gemm", [x, w, g.weight("bias", b)], transB=trans_b)


def make() -> onnx.ModelProto:
    """Build the MLP with initializer weights."""
    g = GraphBuilder("mlp_gemm_relu_gelu", SEED)
    x = g.input("input", ["batch", WIDTH])
    for i, (trans_b, acts1, acts2) in enumerate(BLOCKS):
        with g.scope(f"block{i}"):
            for j, (cin, cout, acts) in enumerate(((WIDTH, INNER, acts1), (INNER, WIDTH, acts2))):
                with g.scope(f"fc{j}"):
                    x = _gemm(g, x, cin, cout, trans_b)
                    for kind in acts:
                        x = _act(g, x, kind)
    g.output(x, "output", ["batch", WIDTH])
    return g.model()
