"""Reading a MODEL path and NAME=N dims as the commands and the tuner take them, with one wording for
each error (a zoo model name is resolved by ``ortfuse.models.resolve``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx


class ModelArgError(ValueError):
    """A MODEL or --dim argument that cannot be used; the message is one sentence for the user."""


def load(path: str, external_data: bool = True) -> onnx.ModelProto:
    """The model at ``path`` (with its external data unless told otherwise)."""
    import onnx

    try:
        return onnx.load(path, load_external_data=external_data)
    except Exception as exc:  # noqa: BLE001 - missing file, protobuf DecodeError, bad external data...
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "no detail"
        raise ModelArgError(f"cannot read {path!r} as an ONNX model ({type(exc).__name__}: {detail})") from None


def parse_dims(items: list[str] | str | None) -> dict[str, int]:
    """``["batch=4", "seq=16"]`` or ``"batch=4,seq=16"`` -> ``{"batch": 4, "seq": 16}``."""
    if isinstance(items, str):
        items = items.split(",")
    out = {}
    for item in items or ():
        for part in filter(None, (p.strip() for p in item.split(","))):
            name, sep, value = part.partition("=")
            if not sep or not name.strip() or not value.strip().isdigit() or int(value) < 1:
                raise ModelArgError(f"dim {part!r} is not NAME=VALUE with a positive integer VALUE "
                                    "(for example batch=64)")
            out[name.strip()] = int(value)
    return out


def format_dims(dims: Mapping[str, int]) -> str:
    """``{"batch": 4, "seq": 16}`` -> ``"batch=4,seq=16"``: what ``parse_dims`` reads back (the
    ``ortfuse.tune_dims`` entry's value)."""
    return ",".join(f"{name}={int(size)}" for name, size in dims.items())
