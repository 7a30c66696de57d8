"""Where ortfuse keeps what it generates (models, tuning decisions, fused plans): a module with no
heavy imports, so a session that only reads its plan cache does not import onnx."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "ORTFUSE_CACHE_DIR"


def cache_dir() -> Path:
    """``$ORTFUSE_CACHE_DIR`` if set, else ``~/.cache/ortfuse``."""
    env = os.environ.get(ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ortfuse"
