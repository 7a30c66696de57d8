"""The metadata contract (DESIGN.md §3): model-level keys that say which fusions are wanted.

Keys live in ``ModelProto.metadata_props`` as strings, so stock ORT reads them through
``get_modelmeta().custom_metadata_map``:

- ``fusion_enabled``: ``"true"`` or ``"false"``.
- ``fusion_pattern_id``: comma-separated pattern ids, or ``"auto"``.
- ``ortfuse_version``: the ortfuse version that wrote the annotation.
- ``ortfuse_graph_digest``: digest of the graph the annotation was written for (a stale annotation
  is detected by comparing it with the digest of the graph being loaded).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import onnx

FUSION_ENABLED = "fusion_enabled"
FUSION_PATTERN_ID = "fusion_pattern_id"
ORTFUSE_VERSION = "ortfuse_version"
GRAPH_DIGEST = "ortfuse_graph_digest"
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
