"""The zoo's table: name -> description, generator, symbolic input and output shapes."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from . import bert, crnn, db_detector, minilm, minilm_dynamo, mlp, mobilenet, picodet, pplcnet, resnet, yolov8

# sample sizes of symbolic dims other than "batch"; "steps" is crnn_recognizer's output length at width 320
DIMS = {"seq": 128, "width": 320, "steps": 80}


@dataclass(frozen=True)
class Spec:
    name: str
    description: str
    module: str  # generator module inside this package
    make: Callable[[], onnx.ModelProto]
    inputs: dict[str, tuple[int | str, ...]]
    outputs: dict[str, tuple[int | str, ...]]
    dtypes: dict[str, int] = field(default_factory=dict)  # input -> onnx elem type; unlisted inputs are FLOAT


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
        # zoo-a: exporter-shaped models (PP-LCNet, PP-OCR recognizer, MiniLM); opsets 15, 11 and 14
        Spec(
            "pplcnet_classifier",
            "PP-LCNet x1.0 classifier, Paddle2ONNX style: HardSwish op, Conv+BN unfolded, opset 15",
            "pplcnet",
            pplcnet.make,
            _IMAGE,
            _LOGITS,
        ),
        Spec(
            "crnn_recognizer",
            "PP-OCR-style CTC text recognizer, dynamic width, run-time Reshape targets, opset 11",
            "crnn",
            crnn.make,
            {"input": ("batch", 3, 48, "width")},
            {"output": ("batch", "steps", 97)},
        ),
        Spec(
            "minilm_encoder",
            "all-MiniLM-L6-v2-like BERT encoder, TorchScript export style, int64 ids and mask, opset 14",
            "minilm",
            minilm.make,
            dict.fromkeys(minilm.INPUTS, ("batch", "seq")),
            {"last_hidden_state": ("batch", "seq", 384)},
            dtypes=dict.fromkeys(minilm.INPUTS, onnx.TensorProto.INT64),
        ),
        # end zoo-a
        # zoo-b: exporter-shaped CNN detectors (PP-OCR DB text detector, PP-PicoDet layout, YOLOv8n)
        Spec(
            "db_text_detector",
            "PP-OCR-style DB text detector: MobileNetV3 x0.5, Add-Clip-Mul-Div HardSwish, RSE-FPN, ConvTranspose head",
            "db_detector",
            db_detector.make,
            {"input": ("batch", 3, 640, 640)},
            {"output": ("batch", 1, 640, 640)},
        ),
        Spec(
            "picodet_layout",
            "PP-PicoDet-style layout detector: Constant weights, PP-LCNet, 94 Add-Clip-Mul-Div HardSwish, CSP-PAN, GFL",
            "picodet",
            picodet.make,
            {"image": ("batch", 3, 800, 608)},
            {"boxes": ("batch", picodet.ANCHORS, 4), "scores": ("batch", picodet.CLASSES, picodet.ANCHORS)},
        ),
        Spec(
            "yolov8n",
            "YOLOv8n-style detector (torch export): Conv+SiLU, C2f, SPPF, Resize, DFL head and box decode",
            "yolov8",
            yolov8.make,
            {"images": ("batch", 3, 320, 320)},
            {"output0": ("batch", 4 + yolov8.CLASSES, yolov8.ANCHORS)},
        ),
        # end zoo-b
        # zoo-attention: the MiniLM encoder as torch's dynamo exporter writes it (opset 18)
        Spec(
            "minilm_encoder_dynamo",
            "all-MiniLM-L6-v2-like BERT encoder, dynamo export style (SDPA decomposed, HF 4-D mask), opset 18",
            "minilm_dynamo",
            minilm_dynamo.make,
            dict.fromkeys(minilm.INPUTS, ("batch", "seq")),
            {"last_hidden_state": ("batch", "seq", 384)},
            dtypes=dict.fromkeys(minilm.INPUTS, onnx.TensorProto.INT64),
        ),
        # end zoo-attention
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
    """Digest of everything the model bytes depend on: the sources of every module of this package
    (a generator may import any of them) and the library versions, onnxruntime's included (BN
    statistics are calibrated by a stock ORT run)."""
    import onnxruntime

    get(name)
    versions = f"numpy {np.__version__}|onnx {onnx.__version__}|onnxruntime {onnxruntime.__version__}"
    h = hashlib.sha256(f"{name}|{versions}".encode())
    for source in sorted(Path(__file__).parent.glob("*.py")):
        h.update(source.name.encode() + b"\0" + source.read_bytes())
    return h.hexdigest()


def concrete(shape: tuple[int | str, ...], batch: int) -> tuple[int, ...]:
    """Replace ``batch`` and the other symbolic dims by sample sizes."""
    return tuple(batch if d == "batch" else DIMS[d] if isinstance(d, str) else d for d in shape)
