"""Registration of fused ops with ORT through onnxruntime-extensions (domain ``ai.onnx.contrib``)."""

from __future__ import annotations


def register_library(sess_options) -> None:
    """Make the fused ops available, then register the extensions library on the options.

    Ops must be defined before ``register_custom_ops_library`` (extensions reads its op list then).
    """
    from onnxruntime_extensions import get_library_path

    from ortfuse.custom_ops.python_ops import register_python_ops

    register_python_ops()
    sess_options.register_custom_ops_library(get_library_path())
