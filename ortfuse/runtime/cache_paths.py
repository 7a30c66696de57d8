"""Where ortfuse keeps what it generates (zoo models, tuning decisions, fused plans, compiled
kernels, source digests): ``$ORTFUSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ortfuse``, else ``~/.cache/ortfuse``
(docs/ARCHITECTURE.md §7). No heavy imports: a session that only reads its plan cache imports no onnx."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "ORTFUSE_CACHE_DIR"
XDG_ENV = "XDG_CACHE_HOME"

# the sub-folder of each cache user
MODELS, PLANS, TUNING, NUMBA, OPS, SOURCES = "models", "plans", "tuning", "numba", "ops", "sources"


def cache_dir(sub: str = "") -> Path:
    """The cache root (``sub``: one user's folder under it), read from the environment on every call."""
    env = os.environ.get(ENV)
    if env:
        root = Path(env).expanduser()
    else:
        xdg = os.environ.get(XDG_ENV)
        # the XDG spec ignores a relative XDG_CACHE_HOME
        base = Path(xdg).expanduser() if xdg and os.path.isabs(os.path.expanduser(xdg)) else Path.home() / ".cache"
        root = base / "ortfuse"
    return root / sub if sub else root
