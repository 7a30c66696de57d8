"""``ortfuse rank MODEL``: measure, on this machine and in the whole model, which kernel serves each
class of matches fastest (each lowering form, the native kernel, and ORT unfused), and store the
order in this machine's kernel ranking, which every later ``fusion=True`` follows.

    ortfuse rank pplcnet_classifier --threads 2
    ortfuse rank model.onnx --inputs data.npz --json
"""

from __future__ import annotations

import json
import sys


def add_arguments(p) -> None:
    p.add_argument("model", help="path of the .onnx model, or a zoo model name (ortfuse models list)")
    p.add_argument("--inputs", metavar="DATA.npz", help="input arrays by input name (default: seeded sample data)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N", help="value of a named dynamic dim")
    p.add_argument("--pattern", action="append", dest="patterns", metavar="ID", help="restrict to these pattern ids")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (default: ORT's)")
    p.add_argument("--budget", type=float, default=60.0, help="seconds of timed runs in all (default 60)")
    p.add_argument("--dry-run", action="store_true", help="measure and print, but do not store the ranking")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def run(args) -> int:
    import dataclasses
    import os

    import numpy as np

    from ortfuse import models
    from ortfuse.fusion.catalogue import UnknownPatternError, validate_patterns
    from ortfuse.ir import feeds, model_args
    from ortfuse.tune import ranking

    try:
        model = model_args.load(models.resolve(args.model))
        dims = model_args.parse_dims(args.dim)
        ids = validate_patterns(args.patterns)
        if args.inputs:
            with np.load(args.inputs) as data:
                sample = {k: data[k] for k in data.files}
        else:
            sample = feeds.random_feeds(feeds.declared_inputs(model), dims=dims, seed=0)
    except (model_args.ModelArgError, UnknownPatternError, feeds.FeedError, OSError, ValueError) as exc:
        print(f"ortfuse rank: {exc}", file=sys.stderr)
        return 2
    say = None if args.json else (lambda line: print(f"  {line}", file=sys.stderr))
    try:
        results = ranking.rank(model, ids, sample, threads=args.threads, budget_s=args.budget, progress=say)
    except Exception as exc:  # the model rejects the sample inputs: say so, no traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"ortfuse rank: the model could not run on the inputs ({first}); pass real inputs with "
              "--inputs data.npz or set dynamic dims with --dim NAME=N", file=sys.stderr)
        return 1
    path = "" if args.dry_run else ranking.store(results, os.path.basename(args.model), args.threads)
    if args.json:
        print(json.dumps({"ranking_file": path, "classes": [dataclasses.asdict(r) for r in results]}, indent=1))
        return 0
    if not results:
        print("no class of matches has more than one kernel here: nothing to rank")
    for r in results:
        print(f"{r.key}  (static choice {r.static})")
        stock = r.p50_ms.get(ranking.STOCK)
        for kid in r.order:
            ratio = r.p50_ms[kid] / stock if stock else float("nan")
            print(f"  {kid:32s} {r.p50_ms[kid]:8.3f} ms  {ratio:.3f}x stock ORT  per repeat vs static "
                  + " ".join(f"{x:.3f}" for x in r.ratios[kid]))
        for kid, why in r.dropped.items():
            print(f"  {kid:32s} dropped: {why}")
    if path:
        print(f"ranking stored in {path}")
    return 0
