"""``ortfuse rank MODEL``: measure, on this machine and in the whole model, which kernel serves each
class of matches fastest (each lowering form, the native kernel, and ORT unfused), and store the
order in this machine's kernel ranking, which every later ``fusion=True`` follows.

    ortfuse rank pplcnet_classifier --threads 2
    ortfuse rank model.onnx --inputs data.npz --json
"""

from __future__ import annotations

import json
import sys

from ortfuse.cli.common import add_input_arguments, command_inputs


def add_arguments(p) -> None:
    p.add_argument("model", help="path of the .onnx model, or a zoo model name (ortfuse models list)")
    add_input_arguments(p)
    p.add_argument("--pattern", action="append", dest="patterns", metavar="ID", help="restrict to these pattern ids")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (default: ORT's)")
    p.add_argument("--budget", type=float, default=60.0, help="seconds of timed runs in all (default 60)")
    p.add_argument("--dry-run", action="store_true", help="measure and print, but do not store the ranking")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args) -> int:
    import dataclasses
    import os

    from ortfuse import models
    from ortfuse.fusion.catalogue import UnknownPatternError, validate_patterns
    from ortfuse.ir import feeds, model_args
    from ortfuse.tune import rank_kernels

    try:
        model = model_args.load(models.resolve(args.model))
        ids = validate_patterns(args.patterns)
        sample = command_inputs(model, args).feeds
    except (model_args.ModelArgError, UnknownPatternError, feeds.FeedError) as exc:
        print(f"ortfuse rank: {exc}", file=sys.stderr)
        return 2
    say = None if args.json else (lambda line: print(f"  {line}", file=sys.stderr))
    results = rank_kernels.rank(model, ids, sample, threads=args.threads, budget_s=args.budget, progress=say)
    path = "" if args.dry_run else rank_kernels.store(results, os.path.basename(args.model), args.threads)
    if args.json:
        print(json.dumps({"ranking_file": path, "classes": [dataclasses.asdict(r) for r in results]}, indent=1))
        return 0
    if not results:
        print("no class of matches has more than one kernel here: nothing to rank")
    for r in results:
        print(f"{r.key}  (static choice {r.static})")
        stock = r.p50_ms.get(rank_kernels.STOCK)
        for kid in r.order:
            ratio = r.p50_ms[kid] / stock if stock else float("nan")
            print(f"  {kid:32s} {r.p50_ms[kid]:8.3f} ms  {ratio:.3f}x stock ORT  per repeat vs static "
                  + " ".join(f"{x:.3f}" for x in r.ratios[kid]))
        for kid, why in r.dropped.items():
            print(f"  {kid:32s} dropped: {why}")
    if path:
        print(f"ranking stored in {path}")
    return 0
