"""The metadata contract (docs/ARCHITECTURE.md §3): model-level keys that say which fusions are wanted.

Keys live in ``ModelProto.metadata_props`` as strings, so stock ORT reads them through
``get_modelmeta().custom_metadata_map``:

- ``fusion_enabled``: ``"true"`` or ``"false"``.
- ``fusion_pattern_id``: comma-separated pattern ids, or ``"auto"``.
- ``ortfuse_version``: the ortfuse version that wrote the annotation.
- ``ortfuse_graph_digest``: digest of the graph the annotation was written for (a stale annotation
  is detected by comparing it with the digest of the graph being loaded).
- ``ortfuse_auto_decisions``: the ``fusion="auto"`` decisions measured by ``ortfuse-annotate --tune``
  (JSON, with the machine/version/shape key they are valid for; ignored wherever the key differs).
- ``ortfuse_rewritten``: ``"true"`` in a model whose graph ortfuse already rewrote (saved by
  ``ortfuse-annotate --rewrite``); such a graph is run as is, never matched again. It is needed
  because a graph lowered to ORT's own ops holds no ortfuse custom op to recognise it by.

Serialized ``ModelProto`` bytes are also read without parsing the graph: the metadata
(``scan_props``) and the files the model's external data names (``external_locations``, part of the
plan cache's identity of a model).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # onnx is imported only where a model is parsed (slow: python -X importtime -c "import onnx")
    import onnx

FUSION_ENABLED = "fusion_enabled"
FUSION_PATTERN_ID = "fusion_pattern_id"
ORTFUSE_VERSION = "ortfuse_version"
GRAPH_DIGEST = "ortfuse_graph_digest"
AUTO_DECISIONS = "ortfuse_auto_decisions"  # JSON written by ``ortfuse-annotate --tune`` (ortfuse.tune.tuner)
REWRITTEN = "ortfuse_rewritten"
AUTO = "auto"


class MetadataError(ValueError):
    """The model's fusion metadata is malformed; the message says which key and what is allowed."""


@dataclass(frozen=True)
class FusionRequest:
    """What a model's metadata asks for: ``enabled`` and the pattern ids (``None`` = all / auto)."""

    enabled: bool
    patterns: tuple[str, ...] | None
    auto: bool
    digest: str | None
    annotated: bool


def read_props(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def write_props(model: onnx.ModelProto, props: dict[str, str]) -> None:
    """Set (or replace) metadata keys in place, keeping all other keys and their order."""
    existing = {p.key: p for p in model.metadata_props}
    for key, value in props.items():
        if key in existing:
            existing[key].value = value
        else:
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value


def parse_request(props: dict[str, str]) -> FusionRequest:
    """Parse the fusion keys; an absent ``fusion_enabled`` means the model is not annotated."""
    raw_enabled = props.get(FUSION_ENABLED)
    if raw_enabled is None:
        return FusionRequest(False, None, False, props.get(GRAPH_DIGEST), False)
    enabled_text = raw_enabled.strip().lower()
    if enabled_text not in ("true", "false"):
        raise MetadataError(
            f"model metadata {FUSION_ENABLED}={raw_enabled!r} is not 'true' or 'false'; "
            f"re-annotate the model with ortfuse-annotate."
        )
    raw_ids = props.get(FUSION_PATTERN_ID, AUTO).strip()
    if raw_ids.lower() == AUTO or raw_ids == "":
        patterns, auto = None, True
    else:
        patterns = tuple(p.strip() for p in raw_ids.split(",") if p.strip())
        if not patterns:
            raise MetadataError(
                f"model metadata {FUSION_PATTERN_ID}={raw_ids!r} names no pattern; "
                f"use comma-separated pattern ids or 'auto'."
            )
        auto = False
    return FusionRequest(enabled_text == "true", patterns, auto, props.get(GRAPH_DIGEST), True)


def graph_digest(model: onnx.ModelProto) -> str:
    """SHA-256 (first 16 hex digits) of the graph's serialized bytes: nodes, weights, I/O.

    Model-level metadata is not part of it, so annotating a model does not change its digest.
    """
    return hashlib.sha256(model.graph.SerializeToString(deterministic=True)).hexdigest()[:16]


_METADATA_PROPS_FIELD = 14  # ModelProto.metadata_props (repeated StringStringEntryProto)


def _varint(buf, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf, start: int, end: int):
    """(field number, value) of the length-delimited and varint fields of one protobuf message;
    length-delimited values are (offset, length) pairs, so large fields (the graph) are skipped."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > end:
                raise ValueError("truncated field")
            yield number, (pos, length)
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if pos != end:
        raise ValueError("truncated message")


_GRAPH_FIELD = 7  # ModelProto.graph


def graph_span(data) -> tuple[int, int] | None:
    """(offset, length) of the graph field of serialized ``ModelProto`` bytes, or None when the bytes
    are not a well-formed message with exactly one graph field."""
    try:
        found = [value for number, value in _fields(data, 0, len(data)) if number == _GRAPH_FIELD]
    except (ValueError, IndexError):
        return None
    if len(found) != 1 or not isinstance(found[0], tuple):
        return None
    return found[0]


def scan_props(data) -> dict[str, str] | None:
    """The model-level metadata of serialized ``ModelProto`` bytes (or an mmap) without parsing the
    graph; None when the bytes are not a well-formed message (the caller then parses normally)."""
    try:
        props = {}
        for number, value in _fields(data, 0, len(data)):
            if number != _METADATA_PROPS_FIELD or not isinstance(value, tuple):
                continue
            entry: dict[int, str] = {}
            for k, v in _fields(data, value[0], value[0] + value[1]):
                if isinstance(v, tuple):
                    entry[k] = bytes(data[v[0]:v[0] + v[1]]).decode("utf-8")
            props[entry.get(1, "")] = entry.get(2, "")
        return props
    except (ValueError, IndexError, UnicodeDecodeError):
        return None


# an external initializer names its file in a StringStringEntryProto whose key (field 1) is "location"
EXTERNAL_DATA_MARK = b"\x0a\x08location"
_VALUE_TAG = b"\x12"  # the entry's value (field 2), written after the key by protobuf's serializer


def external_locations(data) -> list[str] | None:
    """The locations the model's external-data entries name, sorted, without parsing; None when an
    entry is not in the form protobuf's serializer writes (key, then value)."""
    found: set[str] = set()
    pos = data.find(EXTERNAL_DATA_MARK)
    while pos >= 0:
        at = pos + len(EXTERNAL_DATA_MARK)
        try:
            if data[at:at + 1] != _VALUE_TAG:
                return None
            length, at = _varint(data, at + 1)
            found.add(bytes(data[at:at + length]).decode())
        except (IndexError, ValueError, UnicodeDecodeError):
            return None
        pos = data.find(EXTERNAL_DATA_MARK, at + length)
    return sorted(found)
