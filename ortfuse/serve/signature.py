"""The tensors a served model takes and gives, and the check of a request's inputs against them.

A ``Signature`` is read from the replica's session (ORT's ``get_inputs`` / ``get_outputs``): each
tensor's name, numpy dtype and shape, where a dim is an int (fixed), a str (named dynamic dim) or
None (unnamed dynamic dim). ``check(feeds)`` accepts what ORT accepts at its inputs: every input
present and no other, each with the model's dtype and rank, and fixed dims equal; else
``RequestError`` with one sentence saying what is wrong and what to send instead (HTTP 400). Dim
names are not checked across inputs: ORT does not enforce them (exporters name unrelated dims alike,
Paddle's "?"), an op that needs them equal fails in the run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# ORT's element type names -> numpy dtypes the HTTP formats carry (numeric and bool tensors)
ORT_DTYPES = {
    "float": "float32", "double": "float64", "float16": "float16", "bool": "bool",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
}

Dim = int | str | None


class RequestError(ValueError):
    """A request the server will not run; ``status`` is its HTTP status, the message one sentence."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class UnsupportedModel(ValueError):
    """The model has a tensor the HTTP formats cannot carry; the message is one sentence."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple[Dim, ...]

    def describe(self) -> str:
        """e.g. ``'input' float32 [batch, 3, 48, width]``."""
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"'{self.name}' {self.dtype} [{dims}]"

    def as_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @classmethod
    def of_session(cls, session) -> Signature:
        """The session's inputs and outputs; UnsupportedModel for a tensor that is not numeric or bool."""
        return cls(tuple(_spec(a, "input") for a in session.get_inputs()),
                   tuple(_spec(a, "output") for a in session.get_outputs()))

    def input(self, name: str) -> TensorSpec | None:
        return next((s for s in self.inputs if s.name == name), None)

    def as_json(self) -> dict:
        return {"inputs": [s.as_json() for s in self.inputs], "outputs": [s.as_json() for s in self.outputs]}

    def inputs_text(self) -> str:
        return ", ".join(s.describe() for s in self.inputs)

    def check(self, feeds: dict[str, np.ndarray]) -> None:
        """RequestError unless ``feeds`` are inputs the session runs (see the module docstring)."""
        for name in feeds:
            if self.input(name) is None:
                raise RequestError(f"unknown input '{name}': the model takes {self.inputs_text()}; send those names")
        for spec in self.inputs:
            if spec.name not in feeds:
                raise RequestError(f"missing input {spec.describe()}: send every input the model takes "
                                   f"({self.inputs_text()})")
            array = feeds[spec.name]
            if array.dtype != np.dtype(spec.dtype):
                raise RequestError(f"input '{spec.name}' is {array.dtype} but the model takes {spec.dtype}: "
                                   f"send dtype {spec.dtype}")
            if array.ndim != len(spec.shape):
                raise RequestError(f"input '{spec.name}' has shape {list(array.shape)} (rank {array.ndim}) but the "
                                   f"model takes rank {len(spec.shape)}, {spec.describe()}: send a shape of that rank")
            for axis, (want, got) in enumerate(zip(spec.shape, array.shape)):
                if isinstance(want, int) and want != got:
                    raise RequestError(f"input '{spec.name}' has {got} at dim {axis} but the model takes {want} "
                                       f"there, {spec.describe()}: send shape {_fixed_example(spec, array.shape)}")


def _fixed_example(spec: TensorSpec, got: tuple[int, ...]) -> list[int]:
    return [want if isinstance(want, int) else size for want, size in zip(spec.shape, got)]


def _spec(arg, kind: str) -> TensorSpec:
    """A TensorSpec from ORT's NodeArg (``type`` like ``tensor(float)``, ``shape`` of int/str/None)."""
    element = arg.type[len("tensor("):-1] if arg.type.startswith("tensor(") else ""
    dtype = ORT_DTYPES.get(element)
    if dtype is None:
        raise UnsupportedModel(f"the model's {kind} '{arg.name}' is {arg.type}, which the HTTP formats do not "
                               f"carry: serve a model whose inputs and outputs are numeric or bool tensors")
    shape = tuple(d if isinstance(d, int | str) else None for d in (arg.shape or ()))
    return TensorSpec(arg.name, dtype, shape)
