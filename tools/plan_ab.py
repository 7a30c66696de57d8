"""Two plans of one model side by side in one process: ``fusion=True`` under two sets of ortfuse's
environment switches (``ORTFUSE_POINTWISE=off``, ``ORTFUSE_WINOGRAD=on``, ...; none: the default
plan), the question a layout or kernel change asks before it ships.

    python tools/plan_ab.py yolov8n_nudenet --b ORTFUSE_POINTWISE=off [--a NAME=VALUE ...] [--pairs 3]
        [--passes 300] [--threads 2] [--spinning on --block 20] [--json benchmarks/results/]

Each plan gets ``--pairs`` sessions, created alternately (A, B, A, B, ...): in one process the
session created first can run a percent or two slower than an identical one made after it, which
alternate creation spreads over both plans. Every pass runs each session once (``--block`` runs
back to back with spinning) in a shuffled order (seeded). B/A is the median over passes of B's
median run over A's; the A/A and B/B controls set one half of a plan's sessions against the other,
the noise floor of the same run. Sessions are planned at the model's natural input size, as
``ortfuse bench`` plans them, and the plan cache keeps the two plans apart (each switch must be one
it keys plans by). Every output of both plans is checked against stock ORT_DISABLE_ALL first.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))



def parse_switches(pairs: list[str]) -> dict[str, str]:
    """``NAME=VALUE`` arguments as a dict; each NAME must be a switch the plan cache keys plans by."""
    from ortfuse.runtime.plan_cache import _ENV_KEYS

    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in _ENV_KEYS:
            raise SystemExit(f"plan_ab: {pair!r} is not NAME=VALUE with NAME one of {', '.join(_ENV_KEYS)}")
        out[name] = value
    return out


def _make(src, switches: dict[str, str], threads: int, spinning: bool, dims: dict[str, int]):
    """An ``ortfuse_fused`` session (as ``ortfuse bench`` makes it) created under ``switches``."""
    from ortfuse.bench.sessions import make_session

    saved = {k: os.environ.get(k) for k in switches}
    os.environ.update(switches)
    try:
        return make_session("ortfuse_fused", src.path, spinning=spinning, threads=threads, dims=dims)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(model: str, a: dict[str, str], b: dict[str, str], pairs: int, passes: int, threads: int,
        spinning: bool, block: int, seed: int = 0) -> dict:
    """Measure (module docstring); returns the result document."""
    import onnxruntime as ort

    from ortfuse.bench.inputs import make_inputs, resolve_model, tune_dims
    from ortfuse.bench.stats import max_rel_diff

    src = resolve_model(model)
    feeds = make_inputs(src, 1)
    dims = tune_dims(src)
    sessions = []
    for i in range(pairs):
        sessions += [("A", i, _make(src, a, threads, spinning, dims)), ("B", i, _make(src, b, threads, spinning, dims))]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(src.path, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    plans = {tag: {"switches": sw, "notes": [n for n in s.fusion_report.notes if n.startswith("layout")],
                   "fused_ops": s.fusion_report.counts(), "max_rel_diff": max_rel_diff(s.run(None, feeds), ref)}
             for (tag, _, s), sw in zip(sessions[:2], (a, b))}
    times: dict[tuple[str, int], list[float]] = {(tag, i): [] for tag, i, _ in sessions}
    rng = random.Random(seed)
    for _, _, s in sessions:  # warm-up
        s.run(None, feeds)
    order = list(sessions)
    for _ in range(passes):
        rng.shuffle(order)
        for tag, i, s in order:
            for _ in range(block):
                t0 = time.perf_counter()
                s.run(None, feeds)
                times[(tag, i)].append((time.perf_counter() - t0) * 1e3)
    return {"tool": "plan_ab", "model": model, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "settings": {"pairs": pairs, "passes": passes, "threads": threads, "spinning": spinning,
                         "block": block, "seed": seed, "dims": dims,
                         "inputs": {k: list(v.shape) for k, v in feeds.items()}},
            "plans": plans, "summary": summarize(times, pairs, block),
            "raw_ms": {f"{tag}{i}": [round(t, 4) for t in v] for (tag, i), v in times.items()}}


def summarize(times: dict[tuple[str, int], list[float]], pairs: int, block: int) -> dict:
    """B/A and the A/A, B/B controls (module docstring) from each session's run times, in pass order."""
    def pass_medians(tag: str, which: range) -> list[float]:
        series = [times[(tag, i)] for i in which]
        n = min(len(s) for s in series) // block
        return [statistics.median(t for s in series for t in s[p * block:(p + 1) * block]) for p in range(n)]

    every = range(pairs)
    a, b = pass_medians("A", every), pass_medians("B", every)
    out = {"a_ms": statistics.median(a), "b_ms": statistics.median(b),
           "b_over_a": statistics.median(y / x for x, y in zip(a, b))}
    if pairs >= 2:
        first, second = range(0, pairs, 2), range(1, pairs, 2)
        for tag in ("A", "B"):
            x, y = pass_medians(tag, first), pass_medians(tag, second)
            out[f"{tag}/{tag}"] = statistics.median(q / p for p, q in zip(x, y))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a public model name, a zoo name or a path")
    p.add_argument("--a", nargs="*", default=[], metavar="NAME=VALUE", help="plan A's switches (default: none)")
    p.add_argument("--b", nargs="*", default=[], metavar="NAME=VALUE", help="plan B's switches")
    p.add_argument("--pairs", type=int, default=3, help="sessions per plan, created alternately (default 3)")
    p.add_argument("--passes", type=int, default=300, help="shuffled passes over the sessions (default 300)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--spinning", choices=["on", "off"], default="off")
    p.add_argument("--block", type=int, default=1, help="back-to-back runs per session per pass (default 1)")
    p.add_argument("--json", metavar="FOLDER/|FILE", help="write the result (raw run times included)")
    args = p.parse_args(argv)
    a, b = parse_switches(args.a), parse_switches(args.b)
    if a == b:
        raise SystemExit("plan_ab: plans A and B have the same switches; name what differs with --a/--b")
    if args.pairs < 1 or args.passes < 1 or args.block < 1:
        raise SystemExit("plan_ab: --pairs, --passes and --block must be at least 1")
    doc = run(args.model, a, b, args.pairs, args.passes, args.threads, args.spinning == "on", args.block)
    s = doc["summary"]
    for tag in ("A", "B"):
        plan = doc["plans"][tag]
        print(f"{tag} {plan['switches'] or '(default)'}: max rel diff {plan['max_rel_diff']:.1e}; "
              f"{(plan['notes'] or ['no layout'])[0][:300]}")
    controls = ", ".join(f"{k} {s[k]:.3f}" for k in ("A/A", "B/B") if k in s)
    print(f"A {s['a_ms']:.3f} ms, B {s['b_ms']:.3f} ms, B/A {s['b_over_a']:.3f}"
          + (f" ({controls})" if controls else ""))
    if args.json:
        from ortfuse.bench.output import save_result

        stem = f"plan_ab-{Path(args.model).stem}-{doc['date'][:10]}"
        print(f"wrote {save_result(doc, args.json, stem)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
