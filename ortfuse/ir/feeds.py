"""Seeded sample inputs from a model's declared graph inputs (bench, tune and verify feed models alike).

Dynamic dims: a dim named in ``dims`` takes that value; otherwise the first dim is ``batch`` and any
other dynamic dim ``DEFAULT_DIM``. Floats are standard normal, integers uniform in [0, 8) (small
enough to be valid indices of most embeddings), bools fair coins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

DEFAULT_DIM = 128


class FeedError(ValueError):
    """The model declares an input for which no sample data can be made; the message says which."""


Declared = tuple[str, int, list]  # (name, onnx elem type, dims: int or dim_param str or None)


def declared_inputs(model: onnx.ModelProto | str) -> list[Declared]:
    """(name, onnx elem type, dims) of the graph inputs that are not initializers."""
    import onnx

    if isinstance(model, str):
        model = onnx.load(model, load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if not vi.type.HasField("tensor_type"):
            raise FeedError(f"input {vi.name!r} is not a tensor; only tensor inputs can be fed sample data")
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            raise FeedError(f"input {vi.name!r} has no declared shape; pass inputs explicitly")
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
                for d in tt.shape.dim]
        out.append((vi.name, tt.elem_type, dims))
    return out


def concrete_shape(dims: list, batch: int = 1, named: Mapping[str, int] | None = None) -> list[int]:
    """The shape a declared input is fed at (see the module docstring for dynamic dims)."""
    named = named or {}
    out = []
    for i, d in enumerate(dims):
        if isinstance(d, int):
            out.append(d)
        elif d in named:
            out.append(int(named[d]))
        else:
            out.append(batch if i == 0 else DEFAULT_DIM)
    return out


def random_feeds(declared: list[Declared], batch: int = 1, dims: Mapping[str, int] | None = None,
                 seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random arrays for ``declared`` inputs."""
    import onnx

    rng = np.random.default_rng(seed)
    feeds = {}
    for name, elem, decl in declared:
        shape = concrete_shape(decl, batch, dims)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
        if dtype.kind in "fc":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[name] = rng.integers(0, 8, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[name] = rng.random(shape) < 0.5
        else:
            raise FeedError(f"input {name!r} has dtype {dtype}, for which no sample data can be made; "
                            "pass inputs explicitly")
    return feeds
