"""The requests served while ``fusion="auto"`` tunes, as ``tools/auto_bench.py`` records them: the
state of auto and of its tuning process when each arrived, and the ratios and groupings the verdicts
and summaries read (auto's requests against stock's, by the gap before them, by the tuning step)."""

from __future__ import annotations

DURING = ("recording", "tuning")  # auto's states before its final plan
SLOW = 1.5  # a served request over this many times stock's p50 while tuning counts as slow in slow_by_step


def percentile(values: list[float], q: float) -> float | None:
    """The value at quantile ``q`` of ``values`` (the nearest rank), None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def latency_summary(values: list[float]) -> dict:
    """How many latencies (ms), their p50, p99 and largest."""
    return {"n": len(values), "p50_ms": percentile(values, 0.5), "p99_ms": percentile(values, 0.99),
            "max_ms": max(values) if values else None}


def phase(status: str) -> str:
    """Auto's state by its ``fusion_status``: ``recording``, ``tuning`` (both ``DURING``) or ``after``."""
    return ("recording" if status.startswith("serving stock ORT, recording") else
            "tuning" if status.startswith("tuning") else "after")


def gap_state(served) -> str:
    """The tuning process in the gap a request arrives after: ``running`` (continued), ``stopped``
    (kept stopped: ``ServedRuns.held``, or a stock block holds it) or ``none`` (no tuning process)."""
    if served is None or served.child is None:
        return "none"
    return "stopped" if served.held or served.inflight else "running"


def tuning_ratios(lat: dict[str, list[float]]) -> dict:
    """p50 and p99 of auto's requests while it recorded and tuned (``lat["auto_<state>"]``, ms) over
    those of both stock sessions' requests served in the same span, pooled (``p50``, ``p99``; that
    pooled p50 itself, ms: ``stock_p50_ms``); and the A/A control, stock_aa's over stock's
    (``p50_aa``, ``p99_aa``). None where a side has no request."""
    during = [x for s in DURING for x in lat.get(f"auto_{s}", [])]
    first = [x for s in DURING for x in lat.get(f"stock_{s}", [])]
    second = [x for s in DURING for x in lat.get(f"stock_aa_{s}", [])]
    ratios: dict[str, float | None] = {}
    for q in (0.5, 0.99):
        key = f"p{round(q * 100)}"
        mine, ref = percentile(during, q), percentile(first + second, q)
        a, b = percentile(second, q), percentile(first, q)
        ratios[key] = round(mine / ref, 3) if mine and ref else None
        if q == 0.5:
            ratios["stock_p50_ms"] = ref
        ratios[f"{key}_aa"] = round(a / b, 3) if a and b else None
    return ratios


def by_gap(trace: list) -> dict:
    """Requests served while auto recorded and tuned, by block and by the tuning process's state in
    the gap before each (``gap_state``): how many, their p50 and the p50 of the serving thread's
    wake-up (arrival to the start of the run: a late wake-up is part of a request's latency)."""
    groups: dict[str, tuple[list[float], list[float]]] = {}
    for _, block, state, ms, *rest in trace:
        if state not in DURING or len(rest) < 2:
            continue
        process, wake = rest[:2]
        ms_list, wakes = groups.setdefault(f"{block}_{process}" if block == "auto" else block, ([], []))
        ms_list.append(ms)
        wakes.append(wake)
    return {k: {"n": len(v), "p50_ms": percentile(v, 0.5), "wake_p50_ms": percentile(w, 0.5)}
            for k, (v, w) in sorted(groups.items())}


def slow_by_step(trace: list, timeline: list, stock_p50_ms: float | None) -> list[dict]:
    """Auto's requests served while it recorded and tuned, by the tuning step in effect when each
    arrived (the last ``timeline`` event at or before it; "recording" before the first), with how
    many took over ``SLOW`` x stock's p50: where the slow ones fall, on the same clock."""
    rows: dict[str, dict] = {}
    for arrival, block, state, ms, *_ in trace:
        if block != "auto" or state not in DURING:
            continue
        step = next((event for event, t in reversed(timeline) if t <= arrival), "recording")
        row = rows.setdefault(step, {"step": step, "served": 0, "slow": 0, "slow_ms": []})
        row["served"] += 1
        if stock_p50_ms and ms > SLOW * stock_p50_ms:
            row["slow"] += 1
            row["slow_ms"].append(ms)
    return list(rows.values())
