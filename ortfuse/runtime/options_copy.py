"""The caller's ``SessionOptions`` are never modified: a fused session runs on a copy that carries
ortfuse's ops (docs/ARCHITECTURE.md §7).

ORT's Python ``SessionOptions`` gives back its public attributes but not what its methods set: config
entries (only by key), custom op libraries, initializers, dimension overrides, providers, callbacks.
``ortfuse.SessionOptions`` (what ``import ortfuse as ort; ort.SessionOptions()`` makes) is ORT's class
with every such method recording its call; a copy is the attributes read back plus the calls replayed
in order, exact whatever was set. ``onnxruntime.SessionOptions`` made by the caller hold settings
nothing can read back, so a copy could lose one (a custom op library, an initializer): ortfuse then
registers its ops on the caller's object as it always did, and the report says so.

A registered copy is made once per distinct settings and op set and shared by the sessions that ask
for it: registering the extensions library keeps a few KiB until the process exits
(``kernel_choice.op_registration.with_custom_ops``), so a process reusing one options object for many
sessions stays flat. What a copy cannot follow: a load-cancellation flag set on the caller's options
while a session is being created (``set_load_cancellation_flag`` called before is replayed).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import onnxruntime as _ort

_BASE = _ort.SessionOptions
_READERS = frozenset({"get_session_config_entry", "has_providers"})
# the public attributes ORT reads back (graph_optimization_level, threads, execution mode and order,
# log levels and id, enable_* flags, optimized_model_filepath, profile prefix, determinism, ...)
ATTRIBUTES: tuple[str, ...] = tuple(
    n for n in dir(_BASE) if not n.startswith("_") and isinstance(getattr(_BASE, n), property)
    and getattr(_BASE, n).fset is not None)
# every other public method sets something ORT cannot give back (add_session_config_entry,
# register_custom_ops_library, add_initializer, add_free_dimension_override_by_name, add_provider, ...)
RECORDED: tuple[str, ...] = tuple(
    n for n in dir(_BASE) if not n.startswith("_") and n not in _READERS and n not in ATTRIBUTES
    and callable(getattr(_BASE, n)))
INITIALIZER_CALLS = frozenset({"add_initializer", "add_external_initializers",
                               "add_external_initializers_from_files_in_memory"})
PLAIN_OPTIONS_NOTE = ("ortfuse's ops were registered on the caller's onnxruntime.SessionOptions: their custom op "
                      "libraries, initializers and dimension overrides cannot be read back to copy them (options "
                      "made by ortfuse.SessionOptions are copied and left unchanged)")
MAX_COPIES = 64  # registered copies kept for reuse; beyond that the least recently used is let go


class SessionOptions(_ort.SessionOptions):
    """``onnxruntime.SessionOptions``, recording each call that sets something ORT cannot read back,
    so that ortfuse can copy the options exactly instead of changing them (``ortfuse.runtime.options_copy``)."""

    def __init__(self) -> None:
        super().__init__()
        self._ortfuse_calls: list[tuple[str, tuple, tuple]] = []


def _recording(name: str):
    method = getattr(_BASE, name)

    def call(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        self._ortfuse_calls.append((name, args, tuple(sorted(kwargs.items()))))  # only calls ORT accepted
        return result

    call.__name__ = call.__qualname__ = name
    call.__doc__ = method.__doc__
    return call


for _name in RECORDED:
    setattr(SessionOptions, _name, _recording(_name))
del _name


@dataclass(frozen=True)
class Snapshot:
    """Everything set on an ``ortfuse.SessionOptions``: its attributes and the calls made on it."""

    attributes: tuple[tuple[str, object], ...]
    calls: tuple[tuple[str, tuple, tuple], ...]


def snapshot(sess_options) -> Snapshot | None:
    """The settings of ``sess_options``, or None when they cannot all be read back (options that are
    not ``ortfuse.SessionOptions``)."""
    calls = getattr(sess_options, "_ortfuse_calls", None)
    if not isinstance(sess_options, SessionOptions) or calls is None:
        return None
    return Snapshot(tuple((n, getattr(sess_options, n)) for n in ATTRIBUTES), tuple(calls))


def copy_of(snap: Snapshot) -> SessionOptions:
    """New options with every setting of ``snap``: the attributes, then the calls in their order."""
    options = SessionOptions()
    for name, value in snap.attributes:
        setattr(options, name, value)
    for name, args, kwargs in snap.calls:
        getattr(options, name)(*args, **dict(kwargs))
    return options


def supplies_initializers(sess_options) -> bool:
    """Whether ``sess_options`` (an ``ortfuse.SessionOptions``) replace initializers of the model:
    ortfuse's rewrite reads the model's own (it folds weights), so such a session is left to ORT."""
    return any(name in INITIALIZER_CALLS for name, _, _ in getattr(sess_options, "_ortfuse_calls", ()))


_copies: OrderedDict[tuple, object] = OrderedDict()
_copies_lock = threading.Lock()


def with_fused_ops(sess_options, native_ops: frozenset, python_ops: bool) -> tuple[object, str, str]:
    """(options carrying ortfuse's ops for a fused session, why the native ops could not be
    registered or "", a note for the report or ""). ``sess_options`` is left unchanged when it can be
    copied (None, ``ortfuse.SessionOptions``); otherwise the ops are registered on it, with the note."""
    from ortfuse.kernel_choice.op_registration import with_custom_ops

    if sess_options is None:
        return (*with_custom_ops(None, native_ops, python_ops), "")
    snap = snapshot(sess_options)
    if snap is None:
        options, why_not = with_custom_ops(sess_options, native_ops, python_ops)
        return options, why_not, PLAIN_OPTIONS_NOTE
    key: tuple | None = (snap, native_ops, python_ops)
    try:
        hash(key)
    except TypeError:  # a call with an argument that cannot be a key (a list, a dict): copied each time
        key = None
    with _copies_lock:
        if key is not None and key in _copies:
            _copies.move_to_end(key)
            return _copies[key], "", ""
    options, why_not = with_custom_ops(copy_of(snap), native_ops, python_ops)
    if why_not or key is None:
        return options, why_not, ""
    with _copies_lock:
        _copies[key] = options
        while len(_copies) > MAX_COPIES:
            _copies.popitem(last=False)
    return options, "", ""
