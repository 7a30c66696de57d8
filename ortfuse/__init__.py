"""ortfuse: a drop-in ``onnxruntime`` that fuses operator chains ORT leaves unfused.

``import ortfuse as ort`` gives every public name of ``onnxruntime``, and ``ort.__version__`` is
onnxruntime's version; only ``InferenceSession`` is replaced, by a subclass that accepts ``fusion=``
and ``fusion_patterns=`` on top of ORT's exact signature. ortfuse's own version is
``ortfuse.ortfuse_version``.
"""

from __future__ import annotations

import onnxruntime as _ort

# Re-export the whole public onnxruntime namespace first, so that ours overrides it below.
for _name in dir(_ort):
    if not _name.startswith("_") and _name != "backend":
        globals()[_name] = getattr(_ort, _name)
del _name

__version__ = _ort.__version__  # what onnxruntime.__version__ answers: code checking ORT's version keeps working

from ortfuse import _version  # noqa: E402

ortfuse_version: str = _version.__version__  # ortfuse's own version
from ortfuse.fusion.report import FusionReport as FusionReport  # noqa: E402 - after the namespace copy
from ortfuse.runtime.options_copy import SessionOptions as SessionOptions  # noqa: E402 - records what ORT cannot read
from ortfuse.session import InferenceSession as InferenceSession  # noqa: E402


def ops_library_path() -> str:
    """Path of this machine's ahead-of-time native ops library, built first if missing (once per
    machine and version, about a minute). Register it in any ORT host to run a model fused by
    ``ortfuse-annotate --rewrite``: ``SessionOptions.register_custom_ops_library(path)``."""
    from ortfuse.custom_ops.aot.library import library_path

    return str(library_path())


def __getattr__(name: str):
    """``fuse`` and ``backend`` load onnx, slow to import (``python -X importtime -c "import onnx"``),
    so they are imported on first use."""
    if name == "fuse":
        from ortfuse.fusion.rewrite import fuse

        return fuse
    if name == "backend":
        import importlib

        return importlib.import_module("ortfuse.backend")
    if not name.startswith("_") and hasattr(_ort, name):  # a submodule of onnxruntime imported later
        return getattr(_ort, name)                       # (e.g. onnxruntime.transformers)
    raise AttributeError(f"module 'ortfuse' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"fuse", "backend"})
