"""Registration of fused ops with ORT through onnxruntime-extensions (domain ``ai.onnx.contrib``)."""

from __future__ import annotations


def native_disabled_by_env() -> bool:
    """``ORTFUSE_NATIVE`` set to 0/false/off/no turns the native path off (checked without numba)."""
    import os

    return os.environ.get("ORTFUSE_NATIVE", "1").strip().lower() in ("0", "false", "off", "no")


_LIBRARY_MODULE = "_extensions_pydll"


def library_path() -> str:
    """Path of onnxruntime-extensions' shared library, found without importing the package: its
    ``__init__`` imports onnx, and onnx imports ml_dtypes (0.5 s measured here), which a session
    with only native kernels never needs. Falls back to the package's ``get_library_path``."""
    import importlib.machinery
    import importlib.util
    import os

    spec = importlib.util.find_spec("onnxruntime_extensions")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, _LIBRARY_MODULE + suffix)
            if os.path.isfile(path):
                return path
    from onnxruntime_extensions import get_library_path

    return get_library_path()


def register_library(sess_options, python_ops: bool = True) -> None:
    """Make the fused ops available, then register the extensions library on the options.

    Ops must be defined before ``register_custom_ops_library`` (extensions reads its op list then).
    ``python_ops``: also define the ``...Ref`` reference ops (Python ops; importing
    onnxruntime-extensions' Python package for them). Without them the library is registered with
    the native ops alone, and the package is not imported.
    """
    if python_ops:
        from ortfuse.custom_ops.python_ops import register_python_ops

        register_python_ops()
    sess_options.register_custom_ops_library(library_path())


def register_native(sess_options, op_names, python_ops: bool = True) -> bool:
    """Register the native (numba cfunc) kernels of ``op_names``, then the extensions library.

    ``op_names`` are native op types (``OpSpec.name``, e.g. ``FusedAddRelu``; see
    ``native_op_types()``). On success the ops are added to onnxruntime-extensions (once per
    process, compiled or loaded from the on-disk cache on first use) and
    ``register_library(sess_options, python_ops)`` runs, so with ``python_ops`` the ``...Ref``
    Python ops stay available in the same session. Returns False, registering nothing on
    ``sess_options``, when the native path is unavailable (``ORTFUSE_NATIVE=0``, ORT older than 1.17, extensions without
    ``AddExternalCustomOp``, an op without a native kernel, a Python op of the same name, a compile
    failure; why: ``native_unavailable_reason(op_names)``); the caller then uses the ``...Ref`` ops
    and ``register_library``. Call it instead of, never after, ``register_library`` on one
    SessionOptions (the library must be registered once per options, after every op is added).
    """
    from ortfuse.custom_ops import native

    ok, reason = native.ensure_registered(op_names)
    if not ok:
        _last_native_reason[0] = reason
        return False
    _last_native_reason[0] = None
    register_library(sess_options, python_ops)
    return True


_last_native_reason: list = [None]


def native_unavailable_reason(op_names=()) -> str | None:
    """Why ``register_native(..., op_names)`` would return False (or why the last call did); None
    when nothing is known to stand in its way."""
    from ortfuse.custom_ops import native

    reason = native.unavailable_reason()
    if reason:
        return reason
    missing = [n for n in op_names if n not in native.native_ops()]
    if missing:
        return f"no native kernel for {', '.join(missing)}"
    return _last_native_reason[0]


def native_node_attrs(op_type: str, attrs: dict) -> dict:
    """The attributes the native kernel of ``op_type`` reads beyond its spec's, made from the match's
    ``attrs`` ({} when it reads none); ValueError when that kernel cannot run the match."""
    from ortfuse.custom_ops.native_ops import NATIVE_OPS

    op = NATIVE_OPS.get(op_type)
    return op.node_attrs(attrs) if op is not None and op.node_attrs is not None else {}


def native_op_types() -> frozenset[str]:
    """Fused op types (``OpSpec.name``) that have a native kernel."""
    from ortfuse.custom_ops.native_ops import NATIVE_OPS
    from ortfuse.custom_ops.specs import SPECS

    return frozenset(n for n in NATIVE_OPS if n in SPECS)
