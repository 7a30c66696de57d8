"""Whether this machine holds ``fusion="auto"`` decisions for a model, read from its serialized bytes
alone: no onnx, no protobuf parse, no rewriter (docs/ARCHITECTURE.md §7).

Why from the bytes: a session created with ``fusion="auto"`` in the default ``background`` mode
with nothing known for its model serves stock ORT at once and leaves every decision to the live
tuning; what the creating thread must answer is only "is anything known here?". Answering it the
way the tuner keys its cache (``metadata.graph_digest`` of a parsed ``ModelProto``) costs a fresh
process ``import onnx`` and a parse, most of a stock creation's time; answering it from the bytes
ORT itself reads costs one hash of the graph field.

Contract:
- ``graph_digest_of(data)`` is the SHA-256 (first 16 hex digits) of the raw bytes of the
  ``ModelProto.graph`` field. For bytes written by protobuf's serializer (``onnx.save``, every
  exporter that goes through it) these are the bytes ``model.graph.SerializeToString()`` gives, so
  the digest equals ``metadata.graph_digest(model)``: the tuning cache's file names (``file_prefix``)
  are found from either. A file another serializer wrote may give another digest; then nothing is
  found here and the caller falls back to the parsed lookup's answer later (the live tuning reads
  the cache with the parsed digest before it measures), never to a wrong decision: this module only
  says whether decisions may exist, it never applies one.
- ``may_know(data)`` is False only when it is certain that the parsed lookup would find nothing:
  no decisions embedded in the metadata, no tuning file for the graph digest, no external data
  (the parsed lookup digests the graph with its external initializers loaded), not a graph ortfuse
  already rewrote, and the bytes well-formed. Every doubt answers True (parse and look properly).
"""

from __future__ import annotations

import hashlib

from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.foundation.cache_paths import TUNING, cache_dir
from ortfuse.ir import metadata

_DOMAIN_MARK = DOMAIN.encode()  # a node of ortfuse's custom-op domain: a graph saved already fused


def file_prefix(graph_digest: str) -> str:
    """The start of the name of every tuning-cache file for the graph with this digest."""
    return f"{graph_digest[:16]}-"


def has_tuning_files(graph_digest: str) -> bool:
    """True when the tuning cache holds any file for this graph (any machine key, shape, thread count)."""
    folder = cache_dir(TUNING)
    try:
        return any(folder.glob(f"{file_prefix(graph_digest)}*.json"))
    except OSError:
        return True  # an unreadable cache: let the parsed lookup decide


def graph_digest_of(data) -> str | None:
    """The digest of the model's graph field (see the module docstring), or None when the bytes are
    not a well-formed message with exactly one graph field."""
    span = metadata.graph_span(data)
    if span is None:
        return None
    start, length = span
    with memoryview(data) as view:  # no copy of the graph; released before a mmap closes
        return hashlib.sha256(view[start:start + length]).hexdigest()[:16]


def may_know(data, props: dict[str, str]) -> tuple[bool, str | None]:
    """(whether decisions for this model may exist on this machine, the graph digest or None);
    ``props``: the model's metadata (``metadata.scan_props``). See the module docstring."""
    if metadata.AUTO_DECISIONS in props or props.get(metadata.REWRITTEN, "").lower() == "true":
        return True, None
    digest = graph_digest_of(data)
    if digest is None:
        return True, None
    if any(data.find(mark) >= 0 for mark in (metadata.EXTERNAL_DATA_MARK, _DOMAIN_MARK)):
        return True, digest
    return has_tuning_files(digest), digest
