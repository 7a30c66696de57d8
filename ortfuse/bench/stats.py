"""The numbers of one bench run, computed only from its raw latencies and outputs: per-configuration
statistics, ratios against the baseline, the A/A noise band and verdicts, output differences."""

from __future__ import annotations

import math
import statistics

import numpy as np

from ortfuse.bench.sessions import BASELINE, CONTROL
from ortfuse.foundation import protocol


def max_abs_diff(outputs, reference) -> float:
    """Largest |a - b| over all outputs (float64); NaN where both are NaN counts as equal, inf for a
    shape mismatch or a NaN on one side only."""
    worst = 0.0
    if len(outputs) != len(reference):
        return float("inf")
    for a, b in zip(outputs, reference):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return float("inf")
        if a.dtype.kind not in "biufc" or b.dtype.kind not in "biufc":
            if not np.array_equal(a, b):
                return float("inf")
            continue
        if a.size == 0:
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        equal = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
        with np.errstate(invalid="ignore"):
            d = np.where(equal, 0.0, np.abs(a64 - b64))
        d[np.isnan(d)] = np.inf
        worst = max(worst, float(d.max()))
    return worst


def max_rel_diff(outputs, reference) -> float:
    """Largest |a - b| of each output relative to that output's largest |reference| (1 where the
    reference is all zeros), the worst over outputs: the scale-free form of ``max_abs_diff``."""
    if len(outputs) != len(reference):
        return float("inf")
    worst = 0.0
    for a, b in zip(outputs, reference):
        d = max_abs_diff([a], [b])
        b = np.asarray(b)
        finite = np.abs(b[np.isfinite(b)]).astype(np.float64) if b.dtype.kind in "iufc" and b.size else np.zeros(0)
        scale = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        worst = max(worst, d / scale)
    return worst


def summarize(
    raw: dict[str, list[list[float]]], batch: int, baseline: str = BASELINE, control: str | None = CONTROL
) -> dict:
    """Per-configuration statistics and ratios, computed only from the raw latencies (ms)."""
    out: dict[str, dict] = {}
    base = raw.get(baseline)
    ctrl_rr = protocol.ratio_per_repeat(raw[control], base) if (control in raw and base) else None
    for name, reps in raw.items():
        pooled = [x for rep in reps for x in rep]
        p50s = protocol.p50_per_repeat(reps)
        p50 = statistics.median(p50s)
        row = {
            "p50_ms": p50,
            "p50_ms_per_repeat": p50s,
            "p99_ms": protocol.percentile(pooled, 99),
            "min_ms": min(pooled),
            "mean_ms": statistics.fmean(pooled),
            "throughput_per_s": batch / (p50 / 1e3),
            "n": len(pooled),
        }
        if base is not None:
            rr = protocol.ratio_per_repeat(reps, base)
            row["ratio_per_repeat"] = rr
            row["ratio"] = statistics.median(rr)
            row["verdict"] = verdict(rr, ctrl_rr) if name not in (baseline, control) else ""
        out[name] = row
    return out


def noise_band(ctrl: list[float]) -> tuple[float, float]:
    """The A/A control's spread made symmetric around 1 (in log scale): identical sessions differed by
    up to that factor in either direction, so only ratios beyond it on every repeat mean something."""
    w = max(abs(math.log(c)) for c in ctrl)
    return math.exp(-w), math.exp(w)


def verdict(rr: list[float], ctrl: list[float] | None) -> str:
    """ "faster"/"slower" only when every repeat's ratio lies beyond the A/A control's noise band."""
    if not ctrl:
        return "?"
    lo, hi = noise_band(ctrl)
    if max(rr) < lo:
        return "faster"
    if min(rr) > hi:
        return "slower"
    return "~ noise"
