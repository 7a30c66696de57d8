"""Reading an ``onnxruntime.SessionOptions`` as ortfuse needs it (no heavy imports)."""

from __future__ import annotations


def config_entry(sess_options, key: str) -> str:
    """A session config entry, or "" when there are no options or the key is unset (ORT raises for
    a missing key)."""
    if sess_options is None:
        return ""
    try:
        return sess_options.get_session_config_entry(key)
    except RuntimeError:
        return ""
