"""Registration of fused ops with ORT through onnxruntime-extensions (domain ``ai.onnx.contrib``)."""

from __future__ import annotations


def register_library(sess_options) -> None:
    """Register the onnxruntime-extensions shared library (which hosts our fused ops) on the options."""
    from onnxruntime_extensions import get_library_path

    sess_options.register_custom_ops_library(get_library_path())
