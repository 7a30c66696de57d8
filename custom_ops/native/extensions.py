"""onnxruntime-extensions' shared library: its path, found without importing the Python package,
and its exported ``AddExternalCustomOp(const OrtCustomOp*)`` (docs/ARCHITECTURE.md §6). No numba."""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os

_LIBRARY_MODULE = "_extensions_pydll"


def library_path() -> str:
    """Path of onnxruntime-extensions' shared library, found without importing the package: its
    ``__init__`` imports onnx, and onnx imports ml_dtypes, which a session with only native kernels
    never needs. Falls back to the package's ``get_library_path``."""
    spec = importlib.util.find_spec("onnxruntime_extensions")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, _LIBRARY_MODULE + suffix)
            if os.path.isfile(path):
                return path
    from onnxruntime_extensions import get_library_path

    return get_library_path()


def load_add_external_custom_op():
    """``AddExternalCustomOp`` of the library (a ctypes function taking the record's address and
    returning bool), or None when the library does not export it. ``ctypes.CDLL`` of the path is
    the handle ORT opens too, so ops added here are in the op list ORT reads."""
    lib = ctypes.CDLL(library_path())
    fn = getattr(lib, "AddExternalCustomOp", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = ctypes.c_bool
    return fn
