"""Stated timings for the tuner's tests: what ``measure._time_with_control`` returns (ms per
configuration, per repeat, per pass), built from ratios instead of this machine's clock."""

from __future__ import annotations

from collections.abc import Sequence

from ortfuse.tune import measure as measuring


def raw_timing(fused_ms: float, ort_ms: float, ratios: Sequence[float] | None = None, noise: float = 0.0,
               runs: int = 5) -> dict[str, list[list[float]]]:
    """A timing of ``measuring.REPEATS`` repeats of ``runs`` passes: the control runs ``1 + noise``
    times the first stock session in every pass, and the fused plan ``ratios[r]`` times the mean of
    both in every pass of repeat r (default: each at ``fused_ms / ort_ms``)."""
    ratios = list(ratios) if ratios is not None else [fused_ms / ort_ms] * measuring.REPEATS
    control = ort_ms * (1 + noise)
    stock = (ort_ms + control) / 2
    return {"fused": [[r * stock] * runs for r in ratios], "ort": [[ort_ms] * runs for _ in ratios],
            "control": [[control] * runs for _ in ratios]}


def raw_plans(names: Sequence[str], fused_ms: float, ort_ms: float, ratios: Sequence[float] | None = None,
              noise: float = 0.0) -> dict[str, list[list[float]]]:
    """What ``measure._time_plans`` returns when every candidate plan of ``names`` is timed as
    ``raw_timing`` times the fused plan, beside the same two stock sessions."""
    timing = raw_timing(fused_ms, ort_ms, ratios, noise)
    fused = timing.pop("fused")
    return {**{name: [list(r) for r in fused] for name in names}, **timing}


def raw_from_passes(paired: Sequence[float], aa: float = 1.0, ort_ms: float = 1.0) -> dict[str, list[list[float]]]:
    """One repeat whose pass i runs the fused plan ``paired[i]`` times the mean of both stock
    sessions, and the control ``aa`` times the first."""
    control = ort_ms * aa
    stock = (ort_ms + control) / 2
    return {"fused": [[p * stock for p in paired]], "ort": [[ort_ms] * len(paired)],
            "control": [[control] * len(paired)]}
