"""The pattern catalogue, derived from the rule modules of ``ortfuse.fusion.rules`` (found with
pkgutil, one per pattern id): the ids users name in metadata, in ``fusion_patterns=`` and on the CLI,
in priority order, with their matchers, fused op specs, native kernels and lowering forms
(docs/ARCHITECTURE.md §4).

The tables (``RULES``, ``PATTERN_IDS``, ``MATCHERS``, ``SPECS``, ``NATIVE_KERNELS``,
``LOWERING_FORMS``) are built on first use, not when this module is imported: the rule modules
import onnx, and ``ortfuse.session`` imports this module for a session that may never need onnx
(a plan read from the plan cache).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Iterable
from typing import Any

_TABLES = ("RULES", "PATTERN_IDS", "MATCHERS", "SPECS", "NATIVE_KERNELS", "LOWERING_FORMS")

# Former pattern ids, still accepted wherever an id is (``fusion_patterns=``, ``fuse(patterns=)``,
# the ``fusion_pattern_id`` metadata, the CLI's --pattern, decisions and fused nodes written before
# the rename): each is read as the id it became. Reports and new metadata name the current id.
RENAMED = {
    "conv_bn_relu": "conv_act",  # Conv with any of bias/BN/affine steps and five activations, not BN+Relu
    "gemm_relu_gelu": "gemm_act",  # Gemm/MatMul with a Relu, Gelu or Relu-then-Gelu epilogue
}


class UnknownPatternError(ValueError):
    """A pattern id that is not in the catalogue; the message lists the known ids."""


class RuleError(ImportError):
    """A rule module that breaks the rule contract (``ortfuse.fusion.rules``)."""


@functools.lru_cache(maxsize=1)
def _tables() -> dict[str, Any]:
    from ortfuse.fusion import rules
    from ortfuse.fusion.rulekit.contract import PatternRule

    found = []
    for info in pkgutil.iter_modules(rules.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{rules.__name__}.{info.name}")
        rule = getattr(module, "RULE", None)
        if not isinstance(rule, PatternRule) or rule.id != info.name:
            raise RuleError(f"{module.__name__} must declare RULE = PatternRule(id={info.name!r}, ...)")
        found.append(rule)
    found.sort(key=lambda r: r.order)
    specs = [s for r in found for s in r.specs]
    native = [k for r in found for k in r.native]
    forms = [f for r in found for f in r.lowering]
    for what, names in (("order", [r.order for r in found]), ("spec name", [s.name for s in specs]),
                        ("native op type", [k.name for k in native]), ("lowering form", [f.name for f in forms])):
        twice = sorted({str(n) for n in names if names.count(n) > 1})
        if twice:
            raise RuleError(f"rule modules share a {what}: {', '.join(twice)}")
    return {
        "RULES": tuple(found),
        "PATTERN_IDS": tuple(r.id for r in found),
        "MATCHERS": {r.id: r.matcher for r in found},
        "SPECS": {s.name: s for s in specs},
        "NATIVE_KERNELS": tuple(native),
        "LOWERING_FORMS": {f.name: f for f in forms},
        "_VARIANTS": {k.op_type: k.op for k in native if k.op_type and k.op_type != k.op},
    }


def __getattr__(name: str) -> Any:
    if name in _TABLES:
        return _tables()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def canonical_id(pattern_id: str) -> str:
    """The current id of ``pattern_id`` (itself unless it is a former id, ``RENAMED``)."""
    return RENAMED.get(pattern_id, pattern_id)


def rule(pattern_id: str):
    """The ``PatternRule`` of a pattern id (a former id names its rule too)."""
    wanted = canonical_id(pattern_id)
    return next(r for r in _tables()["RULES"] if r.id == wanted)


def spec_for_op_type(op_type: str):
    """The ``OpSpec`` of a fused node's op type (reference ``<Name>Ref``, native, or a native variant
    such as ``FusedAddReluF16``), or None if the op type is not ortfuse's."""
    tables = _tables()
    base = op_type[:-3] if op_type.endswith("Ref") else tables["_VARIANTS"].get(op_type, op_type)
    return tables["SPECS"].get(base)


def _requested(ids: Iterable[str] | str) -> list[str]:
    """The ids asked for, former ids read as their current ones."""
    if isinstance(ids, str):
        ids = [p for p in ids.split(",") if p.strip()]
    return [canonical_id(str(p).strip()) for p in ids]


def check_pattern_ids(ids: Iterable[str] | str | None) -> None:
    """Raise ``UnknownPatternError`` as ``validate_patterns`` does, without importing the rule modules
    when every id is known (a rule's id is its module's name): a session whose plan comes from the
    plan cache imports no onnx."""
    if ids is None:
        return
    from ortfuse.fusion import rules

    names = {info.name for info in pkgutil.iter_modules(rules.__path__) if not info.name.startswith("_")}
    if not all(p in names or p.lower() == "auto" for p in _requested(ids)):
        validate_patterns(ids)  # raises, naming the known ids in catalogue order


def validate_patterns(ids: Iterable[str] | str | None) -> tuple[str, ...]:
    """Return the requested ids in catalogue order (all of them for ``None`` or ``"auto"``), former
    ids (``RENAMED``) as their current ones."""
    known: tuple[str, ...] = _tables()["PATTERN_IDS"]
    if ids is None:
        return known
    wanted = _requested(ids)
    if any(p.lower() == "auto" for p in wanted):
        return known
    unknown = [p for p in wanted if p not in known]
    if unknown:
        raise UnknownPatternError(
            f"unknown fusion pattern id(s) {', '.join(map(repr, unknown))}; "
            f"known ids are: {', '.join(known)} (or 'auto'; former ids {', '.join(RENAMED)} still name their "
            "renamed patterns)."
        )
    return tuple(p for p in known if p in wanted)
