"""``ortfuse tune MODEL``: measure the ``fusion="auto"`` decisions ahead of time and cache them.

    ortfuse tune model.onnx                      # batch 1, other dynamic dims 128 (within the sample budget)
    ortfuse tune resnet50 --batch 64 --threads 2
    ortfuse tune model.onnx --dim seq=384 --force --json
    ortfuse tune model.onnx --inputs data.npz       # measured on these arrays (by input name)
    ortfuse tune model.onnx --export model.plan     # and the plan as one file for identical machines

Sessions created later with ``fusion="auto"`` and the same optimization level, threads and input
shapes (``SessionOptions`` config entry ``ortfuse.tune_dims``, e.g. ``"batch=64"``) load the cached
decisions instead of measuring.

Sample inputs are made within ``ortfuse.ir.feeds.SAMPLE_BUDGET_BYTES``: the dims not given with
``--batch`` / ``--dim`` shrink until they fit, and the command says which sizes it chose and why.
"""

from __future__ import annotations

import json
import sys

from ortfuse.cli.common import add_input_arguments


def add_arguments(p) -> None:
    p.add_argument("model", help="path of the .onnx model, or a zoo model name (ortfuse models list)")
    p.add_argument("--batch", type=int, default=None,
                   help="first dim of every input, kept as given (default 1)")
    add_input_arguments(p, "sample inputs measured on (dims not named: shrunk to fit the sample-input budget)")
    p.add_argument("--pattern", action="append", dest="patterns", metavar="ID", help="restrict to these pattern ids")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads of the sessions to tune for (default: ORT's)")
    p.add_argument("--level", default="ORT_ENABLE_ALL", help="ORT graph optimization level to tune for")
    p.add_argument("--force", action="store_true", help="measure again even when decisions are cached")
    p.add_argument("--budget", type=float, default=None, metavar="S",
                   help="seconds of measuring, the kernel ranking included (default 30); matches not reached "
                        "stay unfused and the decisions are not cached")
    p.add_argument("--json", action="store_true", help="print the decisions as JSON")
    p.add_argument("--export", metavar="PLAN", default=None,
                   help="also write the plan as one file that fusion='auto' sessions on identical machines use "
                        "(InferenceSession(..., plan=PLAN), config entry ortfuse.plan or $ORTFUSE_PLAN)")


def run(args) -> int:
    import onnxruntime as ort

    from ortfuse import models
    from ortfuse.foundation.session_options import make_options
    from ortfuse.fusion.catalogue import UnknownPatternError
    from ortfuse.ir import feeds, model_args
    from ortfuse.tune import tuner as tune

    try:
        dims = model_args.parse_dims(args.dim)
        if args.batch is not None:  # a batch asked for is kept, as --dim values are
            dims.setdefault("batch", args.batch)
        level = getattr(ort.GraphOptimizationLevel, args.level.upper(), None)
        if not isinstance(level, ort.GraphOptimizationLevel):
            raise model_args.ModelArgError(
                f"unknown level {args.level!r}; use ORT_DISABLE_ALL, ORT_ENABLE_BASIC, ORT_ENABLE_EXTENDED, "
                "ORT_ENABLE_LAYOUT or ORT_ENABLE_ALL")
        path = models.resolve(args.model)
        model = model_args.load(path)
        # checked on stock ORT at the shapes the tuner makes its feeds at (feeds.sample_shapes)
        made = feeds.command_feeds(model, args.inputs, dims, budget=feeds.SAMPLE_BUDGET_BYTES)
        feeds.check_feeds(model, made.feeds, made.npz)
    except (model_args.ModelArgError, feeds.FeedError) as exc:
        print(f"ortfuse tune: {str(exc).rstrip('.')}.", file=sys.stderr)
        return 2
    for note in made.notes:
        print(f"note: {note}", file=sys.stderr)
    sample = made.feeds if made.npz is not None else None
    made.feeds = {}  # random ones are made again by the tuner: not held twice
    so = make_options(level, threads=args.threads)
    try:
        tuning = tune.tune(model, args.patterns, so, dims=dims, force=args.force, measure=True,
                           progress=not args.json, sample=sample, budget_s=args.budget)
    except UnknownPatternError as exc:
        print(f"ortfuse tune: {exc}", file=sys.stderr)
        return 2
    if tuning.failure:
        print(f"ortfuse tune: nothing was measured: {tuning.failure.rstrip('.')}.", file=sys.stderr)
        return 1
    if args.export:
        from ortfuse.runtime import plan_artifact

        try:
            summary = plan_artifact.export(path, so, args.patterns, tuning, args.export)
        except (plan_artifact.PlanFileError, OSError) as exc:
            print(f"ortfuse tune: no plan written: {str(exc).rstrip('.')}.", file=sys.stderr)
            return 1
        print(summary, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps({**tuning.to_dict(), "path": tuning.path, "from_cache": tuning.from_cache,
                          "sample_note": tuning.sample_note}, indent=1))
        return 0
    print(tune.table(tuning))
    origin = "read from the cache" if tuning.from_cache else f"measured in {tuning.seconds:.1f} s"
    kept = sum(d.keep for d in tuning.decisions)
    if tuning.path:
        where = tuning.path
    elif not tuning.cacheable:
        where = "(not cached: the budget ran out before every match was measured; give a larger --budget)"
    else:
        where = "(not cached: cache folder not writable)"
    check = tuning.model_check or {}
    how = (f"{kept} kept as a whole plan (every match fused ran {check['ratio']:.3f}x stock ORT)"
           if check.get("whole_plan") and "ratio" in check else f"{kept} won on their subgraph")
    print(f"{len(tuning.decisions)} candidate fusion(s), {how}; decisions {origin}: {where}")
    if tuning.ranked:
        print(f"kernel ranking measured first: {tuning.ranked}")
    return 0
