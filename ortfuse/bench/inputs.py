"""The models ``ortfuse bench`` runs (an .onnx path or a zoo name) and their seeded sample inputs."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np


class BenchError(Exception):
    """A usage problem (unknown model, bad option); the CLI prints it and exits with 2."""


@dataclass
class ModelSource:
    label: str  # zoo name or file name as given
    path: str
    zoo: str | None  # zoo name when resolved through ortfuse.models
    description: str = ""


def zoo():
    """The model zoo ``ortfuse.models``, or None where it is not installed."""
    try:
        from ortfuse import models
    except ImportError:
        return None
    return models


def resolve_model(arg: str) -> ModelSource:
    """A path to an .onnx file, or a zoo name built through ``ortfuse.models.build``."""
    if os.path.isfile(arg):
        return ModelSource(arg, os.path.abspath(arg), None, "")
    models = zoo()
    if models is not None and arg in models.NAMES:
        return ModelSource(arg, str(models.build(arg)), arg, models.describe(arg))
    if arg.lower().endswith(".onnx"):
        raise BenchError(f"model file not found: {arg}")
    known = ", ".join(models.NAMES) if models is not None else "(the model zoo ortfuse.models is not installed)"
    raise BenchError(f"{arg!r} is neither an .onnx file nor a zoo model; zoo models: {known}")


def _declared_inputs(path: str) -> list[tuple[str, int, list]]:
    """(name, onnx elem type, dims) of the graph inputs that are not initializers; dims are int or str/None."""
    from ortfuse.ir import feeds

    try:
        return feeds.declared_inputs(path)
    except feeds.FeedError as exc:
        raise BenchError(f"{path}: {exc}") from None


def file_batch(path: str, batch: int) -> int:
    """The batch a file model actually runs at: ``batch`` unless its first input's first dim is fixed."""
    decl = _declared_inputs(path)
    if decl and decl[0][2] and isinstance(decl[0][2][0], int):
        return decl[0][2][0]
    return batch


def inputs_from_declared(path: str, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs from the model's declared shapes and dtypes (``ortfuse.ir.feeds``: dynamic
    dims are ``batch`` for the first dim, 128 for any other)."""
    from ortfuse.ir import feeds

    try:
        return feeds.random_feeds(_declared_inputs(path), batch=batch, seed=seed)
    except feeds.FeedError as exc:
        raise BenchError(f"{path}: {exc}") from None


def make_inputs(src: ModelSource, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    if src.zoo is not None:
        return zoo().sample_inputs(src.zoo, batch=batch, seed=seed)
    return inputs_from_declared(src.path, batch, seed)
