"""Registration of fused ops with ORT through onnxruntime-extensions (domain ``ai.onnx.contrib``): the
table of native ops, derived from the family modules of ``native.ops``, and registering native ops,
reference Python ops and the extensions library on SessionOptions (docs/ARCHITECTURE.md §6).

Importing this module imports neither numba nor onnxruntime-extensions' Python package.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading

from ortfuse.custom_ops.native.availability import unavailable_reason
from ortfuse.custom_ops.native.extensions import library_path
from ortfuse.custom_ops.native.op_def import NativeOpDef
from ortfuse.custom_ops.numba_setup import configure_numba

FAMILY_PACKAGE = "ortfuse.custom_ops.native.ops"
"""Every module (or subpackage) of this package is a native op family (its docstring: the contract)."""

_lock = threading.RLock()
_discovered: dict[str, NativeOpDef] = {}
_added: dict[str, NativeOpDef] = {}


def _family_modules() -> list[str]:
    package = importlib.import_module(FAMILY_PACKAGE)
    found = [info.name for info in pkgutil.iter_modules(package.__path__, FAMILY_PACKAGE + ".")]
    return sorted(found)


def _discover() -> dict[str, NativeOpDef]:
    """{op name: NativeOpDef} of every family module's ``NATIVE_OPS`` (importing a family compiles nothing)."""
    table: dict[str, NativeOpDef] = {}
    for name in _family_modules():
        module = importlib.import_module(name)
        ops = getattr(module, "NATIVE_OPS", None)
        if not isinstance(ops, tuple) or not all(isinstance(op, NativeOpDef) for op in ops):
            raise TypeError(f"native op family {name} must export NATIVE_OPS, a tuple of NativeOpDef")
        for op in ops:
            if op.name in table:
                raise ValueError(f"native op {op.name} is declared twice (second time in {name})")
            table[op.name] = op
    return table


def native_op_table() -> dict[str, NativeOpDef]:
    """Every op type with a native kernel in this process (name -> definition): the family modules'
    ops (imported on first use, after ``configure_numba``) and those added with ``add_native_op``."""
    with _lock:
        if not _discovered:
            configure_numba()  # before the families' numba functions are decorated
            _discovered.update(_discover())
        return {**_discovered, **_added}


def library_op_table(level: str) -> dict[str, NativeOpDef]:
    """The ops the ahead-of-time ops library of ISA ``level`` holds: the families' ops (not those
    added by ``add_native_op``) whose ``min_level`` is ``level`` or below."""
    from ortfuse.foundation.isa import ISA_LEVELS

    native_op_table()
    with _lock:
        return {name: op for name, op in _discovered.items()
                if ISA_LEVELS.index(level) <= ISA_LEVELS.index(op.min_level)}


def add_native_op(op: NativeOpDef) -> None:
    """Make ``op`` a native op of this process beside the families' (tests add probe ops this way);
    ``register_native`` then registers it like any other. A name the families use is refused."""
    with _lock:
        table = native_op_table()
        if op.name in table and table[op.name] is not op:
            raise ValueError(f"native op {op.name} exists already")
        _added[op.name] = op


def register_library(sess_options, reference_specs=()) -> None:
    """Make the fused ops available, then register the extensions library on the options.

    Ops must be defined before ``register_custom_ops_library`` (extensions reads its op list then).
    ``reference_specs``: the ``OpSpec``s whose ``...Ref`` reference ops to define too (Python ops;
    importing onnxruntime-extensions' Python package for them; the caller has them:
    ``ortfuse.fusion.catalogue.SPECS``). Without them the library is registered with the native ops
    alone, and the package is not imported.
    """
    if reference_specs:
        from ortfuse.custom_ops.python_ops import register_python_ops

        register_python_ops(reference_specs)
    sess_options.register_custom_ops_library(library_path())


def register_native(sess_options, op_names, reference_specs=()) -> bool:
    """Register the native kernels of ``op_names``, then the extensions library.

    The kernels come from the ahead-of-time ops library when it holds them all (nothing compiled, no
    numba imported), else they are compiled in this process (numba cfuncs, once; one warning).

    ``op_names`` are native op types (``OpSpec.name``, e.g. ``FusedAddRelu``; see
    ``native_op_types()``). On success the ops are added to onnxruntime-extensions (once per
    process, compiled or loaded from the on-disk cache on first use) and
    ``register_library(sess_options, reference_specs)`` runs, so the ``...Ref`` Python ops of
    ``reference_specs`` stay available in the same session. Returns False, registering nothing on
    ``sess_options``, when the native path is unavailable (``ORTFUSE_NATIVE=0``, ORT older than 1.17,
    extensions without ``AddExternalCustomOp``, an op without a native kernel, a Python op of the
    same name, a compile failure; why: ``native_unavailable_reason(op_names)``); the caller then uses
    the ``...Ref`` ops and ``register_library``. Call it instead of, never after, ``register_library``
    on one SessionOptions (the library must be registered once per options, after every op is added).
    """
    from ortfuse.custom_ops.native.install import ensure_from_library, ensure_registered

    names = list(dict.fromkeys(op_names))
    reason = unavailable_reason()
    if not reason and ensure_from_library(names):  # the ahead-of-time library: no numba in this process
        _last_native_reason[0] = None
        register_library(sess_options, reference_specs)
        return True
    if not reason:
        _warn_no_library()
        table = native_op_table()
        missing = [n for n in names if n not in table]
        if missing:
            reason = f"no native kernel for {', '.join(missing)}"
        else:
            _ok, reason = ensure_registered([table[n] for n in names])
    if reason:
        _last_native_reason[0] = reason
        return False
    _last_native_reason[0] = None
    register_library(sess_options, reference_specs)
    return True


_last_native_reason: list = [None]
_warned: list = []


def _warn_no_library() -> None:
    """Once per process: the native kernels compile in-process because the ops library is missing
    (its build starts in the background)."""
    from ortfuse.custom_ops.aot.library import build_in_background, disabled, loaded

    if _warned or disabled() or loaded() is not None:
        return
    _warned.append(True)
    import logging

    started = build_in_background()
    logging.getLogger("ortfuse.native").warning(
        "ortfuse: no native ops library for this machine yet; compiling kernels in this process with numba%s",
        " (building the library in the background for later processes)" if started else
        " (build it once with `ortfuse ops-library`)")


def native_unavailable_reason(op_names=()) -> str | None:
    """Why ``register_native(..., op_names)`` would return False (or why the last call did); None
    when nothing is known to stand in its way."""
    reason = unavailable_reason()
    if reason:
        return reason
    missing = [n for n in op_names if n not in native_op_types()]
    if missing:
        return f"no native kernel for {', '.join(missing)}"
    return _last_native_reason[0]


def _library_ops():
    """The loaded ops library when it answers for this process's native ops (no op was added with
    ``add_native_op``), else None: planning then imports neither the op families nor numba."""
    with _lock:
        if _added:
            return None
    from ortfuse.custom_ops.aot.library import loaded

    return loaded()


def native_node_attrs(op_type: str, attrs: dict) -> dict:
    """The attributes the native kernel of ``op_type`` reads beyond its spec's, made from the match's
    ``attrs`` ({} when it reads none); ValueError when that kernel cannot run the match."""
    lib = _library_ops()
    if lib is not None and op_type not in lib.omitted:
        ref = lib.node_attrs.get(op_type, "")
        if not ref:
            return {}
        module, _, name = ref.partition(":")
        return getattr(importlib.import_module(module), name)(attrs)
    op = native_op_table().get(op_type)
    return op.node_attrs(attrs) if op is not None and op.node_attrs is not None else {}


def native_op_types() -> frozenset[str]:
    """Op types that have a native kernel in this process: fused ops (``OpSpec.name``) and their
    native variants (float16, bf16); read from the ops library when it is loaded (with the ops it
    omits for their ISA level, which compile in-process when a session asks for them)."""
    lib = _library_ops()
    return frozenset(lib.ops) | lib.omitted if lib is not None else frozenset(native_op_table())
