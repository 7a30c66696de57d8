"""Registering ortfuse's fused ops (native kernels, and the reference kernels through
onnxruntime-extensions' Python ops) on a SessionOptions, once per options (docs/ARCHITECTURE.md §6, §7)."""

from __future__ import annotations

import threading
import warnings

from ortfuse.foundation.session_options import NATIVE_KEY, PYTHON_OPS_KEY, REGISTERED_KEY, config_entry, make_options

# the start of the reason given when options registered before lack ops a new model needs
REUSED_OPTIONS = "these SessionOptions were registered before"

_default_options: dict[tuple, object] = {}  # see with_custom_ops
_default_options_lock = threading.Lock()
_warned: list[bool] = [False]


def with_custom_ops(sess_options, native_ops: frozenset, python_ops: bool = True) -> tuple:
    """Register our fused ops and the onnxruntime-extensions library on the options, once per options.

    ``python_ops``: the model has reference (Python-op) kernels; without them onnxruntime-extensions'
    Python package (and onnx with it) is not imported. Returns (options, "") or (options, why the
    native ops could not be registered). The library reads the op list when it is registered, so
    options registered before cannot take new native ops (the caller then applies only lowered
    fusions). Only the native ops a model uses are registered: each one registered is compiled on
    a machine's first use, so registering all of them would make every first session pay for all."""
    from ortfuse.custom_ops import registration

    if sess_options is None:
        # Every registration of the extensions library keeps its op domains until the process exits
        # (a few KiB per SessionOptions): sessions made without options share one registered
        # SessionOptions per native op set, so a process creating many stays flat.
        with _default_options_lock:
            key = (native_ops, python_ops)
            if key not in _default_options:
                options, why_not = with_custom_ops(make_options(), native_ops, python_ops)
                if why_not:
                    return options, why_not
                _default_options[key] = options
            return _default_options[key], ""
    if config_entry(sess_options, REGISTERED_KEY) == "1":
        have = set(filter(None, config_entry(sess_options, NATIVE_KEY).split(",")))
        missing = sorted(set(native_ops) - have)
        if python_ops and config_entry(sess_options, PYTHON_OPS_KEY) == "0":
            missing.append("the reference (Python) ops")
        if missing:
            return sess_options, (f"{REUSED_OPTIONS} without {', '.join(missing)} (ops are added when "
                                  "options are first used); use a new SessionOptions per fused session")
        return sess_options, ""
    specs = ()
    if python_ops:  # the reference ops are the fusion rules' specs (importing onnx, as extensions' package does)
        from ortfuse.fusion.catalogue import SPECS

        specs = tuple(SPECS.values())
    if native_ops:
        if not registration.register_native(sess_options, sorted(native_ops), specs):
            return sess_options, registration.native_unavailable_reason(sorted(native_ops)) or "unknown reason"
    else:
        registration.register_library(sess_options, specs)
    sess_options.add_session_config_entry(REGISTERED_KEY, "1")
    sess_options.add_session_config_entry(NATIVE_KEY, ",".join(sorted(native_ops)))
    sess_options.add_session_config_entry(PYTHON_OPS_KEY, "1" if python_ops else "0")
    return sess_options, ""


def warn_native_fallback(reason: str, reused: bool = False, stacklevel: int = 3) -> None:
    """Say that the native kernels could not be registered: every time for reused options (a usage
    to fix), once per process otherwise. ``stacklevel`` as ``warnings.warn`` counts it from here (3: the
    caller of the function that calls this one)."""
    if reused:
        warnings.warn(f"ortfuse: {reason}; only fusions lowered to ORT's own ops are applied",
                      stacklevel=stacklevel)
    elif not _warned[0]:
        _warned[0] = True
        warnings.warn(f"ortfuse: native kernels unavailable ({reason}); using kernels that need no native op "
                      "(lowered to ORT or the reference)", stacklevel=stacklevel)
