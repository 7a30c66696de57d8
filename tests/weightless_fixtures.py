"""Exported models committed without their large weights: the graph as the exporter wrote it (what
the rules match), the weights drawn again when a test loads it.

``strip(model)`` empties every float32 initializer of more than ``MAX_KEPT`` elements, keeping its
name, type and dims, and records that in the model's metadata; ``load(path)`` fills them again with
N(0, STD) values seeded by each name, so a test always sees the same model. STD is BERT's initializer
range (what tools/export_encoder.py draws), and the exporter's own small tensors (shape constants,
LayerNorm parameters, biases) are kept as written.

    python tests/weightless_fixtures.py strip FILE.onnx...   # in place
"""

from __future__ import annotations

import sys
import zlib

import numpy as np
import onnx

MAX_KEPT = 4096
STD = 0.02
MARK = "weightless_fixture"  # metadata key: the names of the emptied initializers, comma-separated


def strip(model: onnx.ModelProto) -> onnx.ModelProto:
    emptied = []
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) > MAX_KEPT:
            name, dims = t.name, list(t.dims)
            t.Clear()
            t.name, t.data_type = name, onnx.TensorProto.FLOAT
            t.dims.extend(dims)
            emptied.append(t.name)
    model.metadata_props.add(key=MARK, value=",".join(emptied))
    return model


def _emptied_names(model: onnx.ModelProto) -> list[str]:
    value = next((p.value for p in model.metadata_props if p.key == MARK), None)
    if value is None:
        raise ValueError(f"not a weightless fixture (no '{MARK}' metadata): load it with onnx.load")
    return [n for n in value.split(",") if n]


def load(path) -> onnx.ModelProto:
    """The fixture at ``path`` with its emptied weights drawn again (the metadata mark removed)."""
    model = onnx.load(str(path))
    names = set(_emptied_names(model))
    for t in model.graph.initializer:
        if t.name in names:
            rng = np.random.default_rng(zlib.crc32(t.name.encode()))
            t.raw_data = (rng.standard_normal(tuple(t.dims)) * STD).astype(np.float32).tobytes()
    kept = [p for p in model.metadata_props if p.key != MARK]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    return model


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "strip":
        sys.exit("usage: python tests/weightless_fixtures.py strip FILE.onnx...")
    for name in sys.argv[2:]:
        onnx.save(strip(onnx.load(name)), name)
