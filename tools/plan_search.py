"""Is a plan that leaves one kind of match to ORT faster than every match fused? A question
``fusion="auto"`` does not ask once every match fused won (docs/ARCHITECTURE.md §7): this tool asks
it with many passes and a fused A/A control, and keeps the answer.

    python tools/plan_search.py MODEL [--dim NAME=N ...] [--threads 2] [--budget 30] [--json benchmarks/results/]

MODEL: a public model, a zoo model or an .onnx file (feeds as ``ortfuse bench`` makes them, seed 0).
The candidates, timed as auto times its candidate plans (``ortfuse.tune.measure.compare_plans``):
every legal match fused, a second plan of every match fused (the fused A/A control: another session
of the same plan), and for each kind of match (a pattern with its kernel path, ``match_kinds``)
every match fused but that kind's. Each is laid out at the feeds' sizes as auto lays its plans out
(``layout.served_sizes``), checked against stock ORT on the feeds, and timed against the others
beside two stock ORT sessions in the same interleaved rounds; ``plan_choice.choose`` judges them,
looks pooled while the order is not settled. The result gives each candidate's median paired
ratio to stock ORT and to every match fused, beside the fused A/A control's, and the plan chosen.
Run it in two processes before reading a percent into it: a plan's session differs from another
plan's by more than two sessions of one plan do.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

WHOLE, WHOLE_AA = "every match fused", "every match fused (A/A)"
WITHOUT = "without "  # + a kind: the candidate leaving its matches to ORT


def match_kinds(model, ids) -> dict[str, list]:
    """The legal matches ``fuse`` makes of ``model`` (``MatchRecord``s), by kind: ``pattern
    kernel-path`` (``conv_act lowered``, ``eltwise_chain native``)."""
    from ortfuse.fusion.rewrite import fuse

    seen: list = []

    def every(record) -> str:
        seen.append(record)
        return ""  # every match kept

    fuse(model, ids, keep=every)
    kinds: dict[str, list] = {}
    for record in seen:
        kinds.setdefault(f"{record.pattern_id} {record.kernel.split(' ')[0]}", []).append(record)
    return kinds


def without(records: list):
    """The ``fuse(keep=...)`` rule fusing every match but ``records``."""
    left = {(r.pattern_id, tuple(r.nodes)) for r in records}
    return lambda record: "left to ORT by plan_search" if (record.pattern_id, tuple(record.nodes)) in left else ""


def run(model_arg: str, dims: dict[str, int], threads: int, budget_s: float) -> dict:
    """Measure (module docstring); returns the result document."""
    import onnx
    import onnxruntime as ort

    from ortfuse.bench.inputs import make_inputs, resolve_model
    from ortfuse.fusion.catalogue import validate_patterns
    from ortfuse.ir import feeds as feeds_mod
    from ortfuse.layout import served_sizes
    from ortfuse.tune import measure
    from ortfuse.tune.plan_choice import per_pass

    src = resolve_model(model_arg, dims=dims)
    feed = make_inputs(src, 1)
    model = onnx.load(src.path)
    ids = validate_patterns(None)
    kinds = match_kinds(model, ids)
    candidates = {WHOLE: measure.Candidate(), WHOLE_AA: measure.Candidate()}
    candidates.update({WITHOUT + kind: measure.Candidate(keep=without(m)) for kind, m in kinds.items()})
    shapes = {name: list(value.shape) for name, value in feed.items()}
    sizes = served_sizes.dims_of(feeds_mod.declared_inputs(model), shapes)
    level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with served_sizes.serving(sizes):
        choice, left_out, looks = measure.compare_plans(model, ids, level, threads, feed, candidates,
                                                        budget_s=budget_s)
    if choice is None or not {WHOLE, WHOLE_AA} <= set(choice.verdicts):
        raise SystemExit(f"plan_search: every match fused did not run ({left_out}); nothing to compare with")
    raw = choice.raw
    rows = {}
    for name, verdict in choice.verdicts.items():
        over_whole = per_pass(raw, name, WHOLE)
        rows[name] = {"over_stock": verdict.paired_ratio, "over_whole": statistics.median(over_whole),
                      "passed": verdict.passed, "matches": len(kinds.get(name.removeprefix(WITHOUT), ()))}
    aa = abs(rows[WHOLE_AA]["over_whole"] - 1)
    helps = [choice.best] if choice.best and choice.best.startswith(WITHOUT) else []  # plan_choice's choice
    return {"tool": "plan_search", "model": model_arg,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "settings": {"threads": threads, "budget_s": budget_s, "sizes": sizes,
                         "inputs": {k: list(v.shape) for k, v in feed.items()}},
            "kinds": {k: len(v) for k, v in kinds.items()}, "candidates": rows, "left_out": left_out,
            "looks": looks, "chosen": choice.best, "fused_aa_noise": aa, "helps": helps,
            "summary": choice.summary()}


def main(argv: list[str] | None = None) -> int:
    from ortfuse.ir.model_args import parse_dims

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a public model name, a zoo name or an .onnx file")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N", help="a dynamic dim of the feeds")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of every session (default 2)")
    p.add_argument("--budget", type=float, default=30.0,
                   help="seconds of timing: the first look a quarter, later looks all of it (default 30)")
    p.add_argument("--json", metavar="FOLDER/|FILE", help="write the result")
    args = p.parse_args(argv)
    doc = run(args.model, parse_dims(args.dim), args.threads, args.budget)
    for name, r in doc["candidates"].items():
        print(f"{name:48s} {r['over_stock']:.3f}x stock ORT, {r['over_whole']:.3f}x every match fused"
              + ("" if r["passed"] else " (not faster than stock ORT)"))
    print(f"fused A/A {1 + doc['fused_aa_noise']:.3f}; {doc['looks']} look(s); chosen by auto's rule: {doc['chosen']}; "
          + (f"faster than every match fused: {doc['helps'][0]}" if doc["helps"]
             else "no kind left out is faster than every match fused"))
    if args.json:
        from ortfuse.bench.output import save_result

        stem = f"plan_search-{Path(args.model).stem}-{doc['date'][:10]}"
        print(f"wrote {save_result(doc, args.json, stem)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
