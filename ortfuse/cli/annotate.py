"""``ortfuse-annotate``: write the fusion metadata into a model, optionally saving it rewritten.

Without ``--rewrite`` only metadata is written and the graph is untouched, so the model still runs
on stock ORT; ``ortfuse.InferenceSession`` fuses it at load time. With ``--rewrite`` the fused graph
is saved: it runs in ortfuse, or in any ORT host that registers the native ops library (``ortfuse
ops-library``; docs/ARCHITECTURE.md §6b) when every fused op has a native kernel (the command says
which case it wrote). Either way it prints what the rewriter found.
"""

from __future__ import annotations

import argparse
import os
import sys

import onnx

from ortfuse.fusion.catalogue import PATTERN_IDS, UnknownPatternError, validate_patterns
from ortfuse.fusion.rewrite import fuse
from ortfuse.ir import metadata, model_args

_EXTERNAL_DATA_THRESHOLD = 1_800_000_000


def annotate(model: onnx.ModelProto, patterns, enabled: bool = True) -> onnx.ModelProto:
    """A copy of ``model`` with the fusion keys written; the graph is not changed."""
    ids = validate_patterns(patterns)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    from ortfuse._version import __version__ as ortfuse_version

    metadata.write_props(out, {
        metadata.FUSION_ENABLED: "true" if enabled else "false",
        metadata.FUSION_PATTERN_ID: "auto" if patterns in (None, "auto") else ",".join(ids),
        metadata.ORTFUSE_VERSION: ortfuse_version,
        metadata.GRAPH_DIGEST: metadata.graph_digest(model),
    })
    return out


def save(model: onnx.ModelProto, path: str) -> None:
    """Save, moving weights to ``<name>.data`` beside it when the model nears protobuf's 2 GiB."""
    if model.ByteSize() > _EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(model, path, save_as_external_data=True, location=os.path.basename(path) + ".data")
    else:
        onnx.save_model(model, path)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ortfuse-annotate",
                                description="Write the fusion metadata into a model, or with --rewrite save it fused.")
    p.add_argument("model", help="path of the .onnx model")
    p.add_argument("--pattern", action="append", dest="patterns", metavar="ID",
                   help=f"pattern id to enable (repeatable); one of: {', '.join(PATTERN_IDS)}")
    p.add_argument("--all", action="store_true", help="enable every pattern (fusion_pattern_id=auto)")
    p.add_argument("--disable", action="store_true", help="write fusion_enabled=false")
    p.add_argument("-o", "--output", help="output path (default: in place; <name>.fused.onnx with --rewrite)")
    p.add_argument("--rewrite", action="store_true", help="save the fused graph instead of only metadata")
    p.add_argument("--report", metavar="JSON", help="write the fusion report as JSON")
    p.add_argument("--tune", action="store_true",
                   help="with --all: measure the auto decisions on this machine (as `ortfuse tune`) and write them "
                        "into the model, so sessions on this machine class need no measuring")
    p.add_argument("--batch", type=int, default=None,
                   help="with --tune: first dim of every input, kept as given (default 1)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                   help="with --tune: a named dynamic dim, kept as given (dims not named: shrunk to fit the "
                        "sample-input budget)")
    return p


def _tuned(model: onnx.ModelProto, batch: int | None, dims: dict[str, int]) -> onnx.ModelProto:
    """``model`` annotated for auto, with the decisions measured now written into its metadata
    (sample inputs within ``ortfuse.ir.feeds.SAMPLE_BUDGET_BYTES``; a ``batch`` given is kept)."""
    from ortfuse.tune import tuner as tune

    named = {**dims, "batch": dims.get("batch", batch)} if batch is not None else dims
    tuning = tune.tune(model, None, dims=named, force=True, measure=True, progress=True)
    print(tune.table(tuning))
    if tuning.sample_note:
        print(f"note: {tuning.sample_note}")
    result = annotate(model, None)
    tune.embed(result, tuning)
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.patterns and not args.all and not args.disable:
        print("ortfuse-annotate: name at least one --pattern ID, or --all, or --disable.", file=sys.stderr)
        return 2
    patterns = None if args.all or not args.patterns else args.patterns
    if args.tune and (patterns is not None or args.disable or args.rewrite):
        print("ortfuse-annotate: --tune measures the auto policy over every pattern: use it with --all, "
              "without --pattern, --disable or --rewrite.", file=sys.stderr)
        return 2
    try:
        validate_patterns(patterns)
        dims = model_args.parse_dims(args.dim)
        model = model_args.load(args.model)
    except (UnknownPatternError, model_args.ModelArgError) as exc:
        print(f"ortfuse-annotate: {exc}", file=sys.stderr)
        return 2
    fused, report = fuse(model, patterns)
    print(report.table())
    if args.rewrite and not args.disable:
        out_path = args.output or os.path.splitext(args.model)[0] + ".fused.onnx"
        result = fused if report.applied else annotate(model, patterns)
    elif args.tune:
        out_path = args.output or args.model
        result = _tuned(model, args.batch, dims)
    else:
        out_path = args.output or args.model
        result = annotate(model, patterns, enabled=not args.disable)
    save(result, out_path)
    if args.report:
        with open(args.report, "w") as fh:
            fh.write(report.to_json())
    what = " (fused graph)" if args.rewrite and report.applied else " (metadata only)"
    print(f"wrote {out_path}" + (" (metadata with the measured auto decisions)" if args.tune else what))
    if args.rewrite and report.applied:
        print(_host_note(result))
    return 0


def _host_note(fused) -> str:
    """Where the fused graph runs: any ORT host with the ops library, or only ortfuse (reference ops)."""
    from ortfuse.custom_ops.registration import native_op_types
    from ortfuse.custom_ops.specs import DOMAIN

    custom = {n.op_type for n in fused.graph.node if n.domain == DOMAIN}
    if not custom:
        return "it uses ORT's own ops only: any ORT host runs it"
    python_only = sorted(custom - native_op_types())
    if python_only:
        return (f"it needs ortfuse to run ({', '.join(python_only)} have no native kernel here); with the "
                "native path available, rewrite again for a model any ORT host runs")
    return ("any ORT host runs it with the native ops library registered: "
            "SessionOptions.register_custom_ops_library(<path printed by `ortfuse ops-library`>)")
