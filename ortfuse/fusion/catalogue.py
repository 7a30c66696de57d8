"""The pattern catalogue: the ids users name in metadata, in ``fusion_patterns=`` and on the CLI."""

from __future__ import annotations

from collections.abc import Iterable

# Order is priority: when two patterns could claim the same nodes, the earlier one wins.
PATTERN_IDS: tuple[str, ...] = (
    "conv_add_relu",
    "conv_bn_relu",
    "gemm_relu_gelu",
    "add_relu",
    "hardswish",
    "silu",
    "eltwise_chain",
)


class UnknownPatternError(ValueError):
    """A pattern id that is not in the catalogue; the message lists the known ids."""


def validate_patterns(ids: Iterable[str] | None) -> tuple[str, ...]:
    """Return the requested ids in catalogue order (all of them for ``None`` or ``"auto"``)."""
    if ids is None:
        return PATTERN_IDS
    if isinstance(ids, str):
        ids = [p for p in ids.split(",") if p.strip()]
    wanted = [str(p).strip() for p in ids]
    if any(p.lower() == "auto" for p in wanted):
        return PATTERN_IDS
    unknown = [p for p in wanted if p not in PATTERN_IDS]
    if unknown:
        raise UnknownPatternError(
            f"unknown fusion pattern id(s) {', '.join(map(repr, unknown))}; "
            f"known ids are: {', '.join(PATTERN_IDS)} (or 'auto')."
        )
    return tuple(p for p in PATTERN_IDS if p in wanted)
