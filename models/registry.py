"""The zoo's table: name -> description, generator, symbolic input and output shapes."""

from __future__ import annotations

import functools
import hashlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from . import bert, mlp, mobilenet, resnet

DIMS = {"seq": 128}  # sample sizes of symbolic dims other than "batch"


@dataclass(frozen=True)
class Spec:
    name: str
    description: str
    module: str  # generator module inside this package
    make: Callable[[], onnx.ModelProto]
    inputs: dict[str, tuple[int | str, ...]]
    outputs: dict[str, tuple[int | str, ...]]


_IMAGE = {"input": ("batch", 3, 224, 224)}
_LOGITS = {"output": ("batch", 1000)}
_FEATURES = {"input": ("batch", 16, 112, 112)}
_FEATURES_OUT = {"output": ("batch", 80, 14, 14)}
_TOKENS = {"hidden_states": ("batch", "seq", 768)}

SPECS: dict[str, Spec] = {
    s.name: s
    for s in (
        Spec("resnet50", "ResNet-50 v1.5, Conv+BN unfolded, initializer weights", "resnet", resnet.make,
             _IMAGE, _LOGITS),
        Spec(
            "resnet50_const",
            "ResNet-50 v1.5 with Constant-node weights and Constant->Reshape->Add conv biases",
            "resnet",
            functools.partial(resnet.make, const_weights=True),
            _IMAGE,
            _LOGITS,
        ),
        Spec(
            "bert_encoder",
            "4-layer BERT-base encoder: erf-Gelu FFN, decomposed LayerNorm",
            "bert",
            bert.make,
            _TOKENS,
            {"output": ("batch", "seq", 768)},
        ),
        Spec(
            "mlp_gemm_relu_gelu",
            "4-block Gemm MLP with Relu, erf-Gelu and tanh-Gelu epilogues",
            "mlp",
            mlp.make,
            {"input": ("batch", 512)},
            {"output": ("batch", 512)},
        ),
        Spec(
            "mobilenetv3_block",
            "6 MobileNetV3 blocks: HardSwish as Add-Clip-Div-Mul, SiLU, squeeze-excite",
            "mobilenet",
            mobilenet.make,
            _FEATURES,
            _FEATURES_OUT,
        ),
        Spec(
            "mobilenetv3_block_const",
            "mobilenetv3_block with Constant-node weights and Constant->Reshape->Add conv biases",
            "mobilenet",
            functools.partial(mobilenet.make, const_weights=True),
            _FEATURES,
            _FEATURES_OUT,
        ),
    )
}


def get(name: str) -> Spec:
    """The spec of ``name``; a KeyError lists the known names."""
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(SPECS)}") from None


def make(name: str) -> onnx.ModelProto:
    """Generate ``name`` in memory; the doc string carries its description."""
    spec = get(name)
    model = spec.make()
    model.graph.name = name
    model.doc_string = f"{name}: {spec.description}"
    return model


def recipe(name: str) -> str:
    """Digest of everything the model bytes depend on: generator sources and library versions."""
    spec = get(name)
    h = hashlib.sha256(f"{name}|numpy {np.__version__}|onnx {onnx.__version__}".encode())
    for module in ("builder", "layers", "registry", spec.module):
        h.update(Path(importlib.import_module(f"{__package__}.{module}").__file__).read_bytes())
    return h.hexdigest()


def concrete(shape: tuple[int | str, ...], batch: int) -> tuple[int, ...]:
    """Replace ``batch`` and the other symbolic dims by sample sizes."""
    return tuple(batch if d == "batch" else DIMS[d] if isinstance(d, str) else d for d in shape)
