"""``ortfuse profile MODEL``: ORT's own profiler on the fused and the unfused model, side by side:
time per run, per op type and per node, and each pattern's saving (``ortfuse.profiling`` says how);
``--peer openvino`` adds OpenVINO's CPU plugin: its wall time, per-layer counters and what it fuses.

    ortfuse profile ppocrv4_rec --peer openvino --threads 2 --runs 30 --json benchmarks/results/
    # -> benchmarks/results/profile-ppocrv4_rec-<date>.json, and the text report
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

from ortfuse.cli.common import add_input_arguments, command_inputs, default_patterns
from ortfuse.profiling.output import format_text
from ortfuse.profiling.plot import plot
from ortfuse.profiling.run import profile
from ortfuse.profiling.trace import ProfileError


def add_arguments(p) -> None:
    p.add_argument("model", help="path of the .onnx model, a zoo model name or a public model name")
    p.add_argument("--runs", type=int, default=10, help="counted runs per configuration (default 10)")
    p.add_argument("--warmup", type=int, default=1, help="uncounted first runs per configuration (default 1)")
    p.add_argument("--top", type=int, default=10, help="rows per table (default 10)")
    p.add_argument("--patterns", "--pattern", nargs="+", action="extend", dest="patterns", metavar="ID",
                   help="pattern ids to fuse (default: the model's fusion_pattern_id, else all)")
    add_input_arguments(p)
    p.add_argument("--disable-all", action="store_true", help="also profile stock ORT_DISABLE_ALL")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads of every session, the peer's included (default 0: each runtime's default)")
    p.add_argument("--peer", choices=["openvino"],
                   help="also run OpenVINO's CPU plugin (f32, one stream, the same threads) in the same rounds: "
                        "its wall time, its per-layer counters and what it fuses")
    p.add_argument("--out-dir", metavar="DIR",
                   help="write the raw traces (<config>.json), profile.json and profile.png")
    p.add_argument("--json", nargs="?", const="-", metavar="OUT.json|FOLDER/",
                   help="print JSON instead of text; given a file, write it there and print the text; given a "
                        "folder, write profile-<model>-<date>.json in it (benchmarks/results/ naming)")


def run(args) -> int:
    from ortfuse import models
    from ortfuse.fusion.catalogue import UnknownPatternError
    from ortfuse.ir import feeds, model_args

    try:
        if args.top < 1:
            raise ProfileError("--top must be at least 1")
        if args.peer:
            from ortfuse.bench.peers import available

            missing = available(args.peer)
            if missing:
                raise ProfileError(missing)
        path = models.resolve(args.model)
        model = model_args.load(path)
        made = command_inputs(model, args)
        if args.out_dir and os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
            raise ProfileError(f"--out-dir {args.out_dir!r} exists and is not a directory")
        try:
            result = profile(model, made.feeds, args.runs, args.warmup, default_patterns(model, args.patterns),
                             args.disable_all, args.out_dir, label=path, threads=args.threads, peer=args.peer)
        except ProfileError:
            raise
        except Exception as exc:  # noqa: BLE001 - stock ORT ran these inputs: the fused session is to blame
            raise ProfileError(f"a profiled session failed on inputs stock ORT runs (ORT: {feeds.ort_message(exc)}); "
                               f"`ortfuse verify {args.model}` finds the fused op to blame") from None
        result.notes = made.notes + result.notes
        if args.out_dir:
            with open(os.path.join(args.out_dir, "profile.json"), "w") as fh:
                json.dump(result.to_dict(), fh, indent=2)
            try:
                plot(result, os.path.join(args.out_dir, "profile.png"), args.top)
            except RuntimeError as exc:  # matplotlib missing
                result.notes.append(f"no chart: {exc}")
    except (ProfileError, feeds.FeedError, model_args.ModelArgError, UnknownPatternError) as exc:
        print(f"ortfuse profile: {str(exc).rstrip('.')}.", file=sys.stderr)
        return 2
    if args.json == "-":
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    print(format_text(result, args.top))
    if args.json:
        from ortfuse.bench.output import result_file

        target = result_file(args.json, f"profile-{pathlib.Path(args.model).stem}-{result.environment['date'][:10]}")
        pathlib.Path(target).parent.mkdir(parents=True, exist_ok=True)
        with open(target, "w") as fh:
            json.dump(result.to_dict(), fh, indent=1)
            fh.write("\n")
        print(f"wrote {target}")
    if args.out_dir:
        print(f"wrote {args.out_dir}: " + ", ".join(sorted(os.listdir(args.out_dir))))
    return 0
