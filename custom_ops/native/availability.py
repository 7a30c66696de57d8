"""Why native ops cannot run in this process, or None when they can: ``ORTFUSE_NATIVE``, the
platform, the onnxruntime API version and onnxruntime-extensions' ``AddExternalCustomOp``. No numba:
the registry asks before anything is compiled."""

from __future__ import annotations

import os
import platform
import sys
import threading

from ortfuse.custom_ops import abi
from ortfuse.custom_ops.native.extensions import load_add_external_custom_op

_lock = threading.Lock()
_add_external: list = []  # [AddExternalCustomOp or False] once looked up


def native_disabled_by_env() -> bool:
    """``ORTFUSE_NATIVE`` set to 0/false/off/no turns the native path off."""
    return os.environ.get("ORTFUSE_NATIVE", "1").strip().lower() in ("0", "false", "off", "no")


def _platform_reason() -> str | None:
    if sys.maxsize <= 2**32 or sys.byteorder != "little":
        return "native ops need a 64-bit little-endian process"
    if platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"):
        return f"native ops are untested on {platform.machine()!r} (x86_64 and aarch64 only)"
    return None


def runtime_api_version() -> int | None:
    """The OrtApi version of the installed ORT (its minor version for 1.x), or None if unknown."""
    import onnxruntime

    try:
        major, minor = (int(p) for p in onnxruntime.__version__.split(".")[:2])
    except ValueError:
        return None
    return minor if major == 1 else None


def add_external_custom_op():
    """extensions' ``AddExternalCustomOp`` (looked up once), or None: see ``unavailable_reason``."""
    return _add_external[0] or None if _add_external else None


def unavailable_reason() -> str | None:
    """Why the native path cannot be used in this process, or None when it can."""
    if native_disabled_by_env():
        return "disabled by ORTFUSE_NATIVE"
    reason = _platform_reason()
    if reason:
        return reason
    version = runtime_api_version()
    if version is None:
        return "the onnxruntime API version is unknown"
    if version < abi.MIN_RUNTIME_API_VERSION:
        return f"onnxruntime API {version} is older than the {abi.MIN_RUNTIME_API_VERSION} native ops need"
    with _lock:
        if not _add_external:
            try:
                _add_external.append(load_add_external_custom_op() or False)
            except (OSError, ImportError) as exc:
                return f"cannot load onnxruntime-extensions: {exc}"
        if _add_external[0] is False:
            return "onnxruntime-extensions does not export AddExternalCustomOp"
    return None
