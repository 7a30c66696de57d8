"""The models ``ortfuse bench`` runs (an .onnx path, a zoo name or a public model's name) and their inputs:
seeded sample data or given arrays (``ortfuse.ir.feeds``), checked on stock ORT before any timing."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np


class BenchError(Exception):
    """A usage problem (unknown model, bad option); the CLI prints it and exits with 2."""


class ModelUnavailable(BenchError):
    """A public model that could not be fetched; a suite goes on without it (the message: one sentence)."""


@dataclass
class ModelSource:
    """A model to bench and how its inputs are made: arrays from ``npz`` (``--inputs``), else sample
    data with the named dynamic dims ``dims`` (``--dim``; the batch is the bench's own)."""

    label: str  # zoo name, public model name or file name as given
    path: str
    zoo: str | None  # zoo name when resolved through ortfuse.models
    description: str = ""
    npz: str | None = None
    dims: dict[str, int] = field(default_factory=dict)
    public: dict | None = None  # a public model's origin (ortfuse.models.public: package, version, sha256...)


def zoo():
    """The model zoo ``ortfuse.models``, or None where it is not installed."""
    try:
        from ortfuse import models
    except ImportError:
        return None
    return models


def public_models():
    """The public models' pins ``ortfuse.models.public``, or None where the zoo package is not installed."""
    try:
        from ortfuse.models import public
    except ImportError:
        return None
    return public


SUITES = ("public",)  # --suite names


def suite_models(suite: str) -> list[str]:
    """The model names of ``suite``: ``public``, the public models (``ortfuse.models.public``)."""
    public = public_models()
    if suite != "public":
        raise BenchError(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")
    if public is None:
        raise BenchError("the public suite needs ortfuse.models, which is not installed: pip install -e .")
    return list(public.NAMES)


def resolve_model(arg: str | ModelSource, npz: str | None = None, dims: dict[str, int] | None = None) -> ModelSource:
    """A path to an .onnx file, a zoo name built through ``ortfuse.models.build``, or a public model's
    name fetched through ``ortfuse.models.public.fetch`` (``ModelUnavailable`` when that fails), with the
    inputs options ``npz`` and ``dims``; a ``ModelSource`` is returned as it is."""
    if isinstance(arg, ModelSource):
        return arg
    dims = dict(dims or {})
    if os.path.isfile(arg):
        return ModelSource(arg, os.path.abspath(arg), None, "", npz, dims)
    models = zoo()
    if models is not None and arg in models.NAMES:
        return ModelSource(arg, str(models.build(arg)), arg, models.describe(arg), npz, dims)
    public = public_models()
    if public is not None and arg in public.NAMES:
        try:
            path = public.fetch(arg)
        except public.FetchError as exc:
            raise ModelUnavailable(f"{arg}: {exc}") from None
        return ModelSource(arg, str(path), None, public.describe(arg), npz, dims, public.get(arg).record())
    if arg.lower().endswith(".onnx"):
        raise BenchError(f"model file not found: {arg}")
    known = ", ".join(models.NAMES) if models is not None else "(the model zoo ortfuse.models is not installed)"
    named = f"; public models: {', '.join(public.NAMES)}" if public is not None else ""
    raise BenchError(f"{arg!r} is neither an .onnx file nor a zoo model nor a public model; zoo models: {known}{named}")


def _declared_inputs(path: str) -> list[tuple[str, int, list]]:
    """(name, onnx elem type, dims) of the graph inputs that are not initializers; dims are int or str/None."""
    from ortfuse.ir import feeds

    try:
        return feeds.declared_inputs(path)
    except feeds.FeedError as exc:
        raise BenchError(f"{path}: {exc}") from None


def tune_dims(src: ModelSource) -> dict[str, int]:
    """The named dynamic dims ortfuse's sessions are planned at besides the batch (``ortfuse.tune_dims``):
    ``--dim``'s, and those of a public model's natural input shape by the names its inputs declare
    (``layout.served_sizes.dims_of``: a name the shape gives two sizes is not named)."""
    from ortfuse.ir.model_args import parse_dims
    from ortfuse.layout.served_sizes import dims_of

    dims = {k: int(v) for k, v in src.dims.items() if k != "batch"}
    if src.public is None or src.npz is not None:
        return dims
    # the batch is passed apart: each input's batch axis fixed here so that it is not named
    spec = public_models().get(src.label)

    def batch_fixed(name: str, dims_: list) -> list:
        return [0 if axis == spec.batch_axis(name) else d for axis, d in enumerate(dims_)]

    declared = [(name, elem, batch_fixed(name, dims_)) for name, elem, dims_ in _declared_inputs(src.path)]
    shapes = {name: spec.shape_at(name, 0) for name in spec.inputs}
    for name, size in parse_dims(dims_of(declared, shapes)).items():
        dims.setdefault(name, size)
    return dims


def file_batch(path: str, batch: int) -> int:
    """The batch a file model actually runs at: ``batch`` unless its first input's first dim is fixed."""
    decl = _declared_inputs(path)
    if decl and decl[0][2] and isinstance(decl[0][2][0], int):
        return decl[0][2][0]
    return batch


def inputs_from_declared(path: str, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded sample inputs from the model's declared shapes and dtypes, drawn by the model's rules
    (``ortfuse.ir.feeds.random_feeds``: dynamic dims are ``batch`` for the first dim, 128 for any other)."""
    return make_inputs(ModelSource(path, path, None), batch, seed, check=False)


def make_inputs(src: ModelSource, batch: int, seed: int = 0, check: bool = True) -> dict[str, np.ndarray]:
    """The inputs of ``src`` at ``batch``: its ``npz`` arrays, else sample data (a zoo model's
    ``sample_inputs`` with its ``dims``, a public model's at its natural shape, a file's
    ``ortfuse.ir.feeds.command_feeds`` with its ``dims``). With ``check``, stock ORT runs them once
    first: a ``BenchError`` with one sentence and the fix when it raises."""
    from ortfuse.ir import feeds

    try:
        if src.zoo is not None and src.npz is None:
            data = zoo().sample_inputs(src.zoo, batch=batch, seed=seed, dims=src.dims)
        elif src.public is not None and src.npz is None:
            data = public_models().sample_inputs(src.label, batch=batch, seed=seed)
        else:
            data = feeds.command_feeds(src.path, src.npz, {**src.dims, "batch": batch}, batch, seed).feeds
        if check:
            feeds.check_feeds(src.path, data, src.npz)
    except feeds.FeedError as exc:
        raise BenchError(f"{src.label}: {exc}") from None
    return data


def npz_batch(src: ModelSource) -> int:
    """The batch of ``src``'s ``npz`` arrays: the first dim of its first input's array (1 for a scalar)."""
    shape = next(iter(make_inputs(src, 1, check=False).values())).shape
    return int(shape[0]) if shape else 1
