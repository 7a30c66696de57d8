"""Time every kernel path of the fused ops that have lowering forms (conv and GEMM) on the zoo's real
shapes: the data behind the priorities each rule gives its lowering forms (``ortfuse.fusion.rules``).

Usage::

    python tools/lowering_bench.py [--case resnet50:1 --case mlp_gemm_relu_gelu:64 ...]
                                   [--runs R] [--repeats K] [--gap-ms G] [--spin] [--no-reference]
                                   [--only OP/EPILOGUE,...] [--json PATH]

For each zoo model and batch (``--case NAME:BATCH``, default resnet50:1, mobilenetv3_block:1,
mlp_gemm_relu_gelu:1, mlp_gemm_relu_gelu:64, bert_encoder:1), every match of the conv and GEMM patterns is cut out
of the model with its real shapes (batch fixed); the matches of one fused op and epilogue (e.g.
FusedConvAct/hardswish: all 8 in mobilenetv3_block) are put side by side in one group model, so a
run of the group model costs what those subgraphs cost in the whole model. Each group is run as:

- ``ort``: the original, unfused subgraphs at ORT_ENABLE_ALL (ORT's own fusions apply: Conv+BN+Relu
  becomes an NCHWc FusedConv) — the baseline;
- ``ort_aa``: a second, identical ``ort`` session: the A/A control, the noise floor of this very run;
- one configuration per kernel the registry has for that op and epilogue: ``native``,
  ``reference`` (unless ``--no-reference``) and ``lowered:<form>`` for every lowering rule that
  serves it, each the group rewritten by ``ortfuse.fuse(group, kernels=...)`` and run by
  ``ortfuse.InferenceSession`` at ORT_ENABLE_ALL.

Single runs interleaved (``A B .. B A``, Williams-rotated; docs/ARCHITECTURE.md §8, ``ortfuse.foundation.protocol``),
``--repeats`` times; printed per configuration: p50 ms and ``config/ort`` (median over repeats of
the per-repeat p50 ratio), beside the A/A ratio. Every configuration's outputs are first checked
against the group run by stock ORT at ORT_DISABLE_ALL (max |diff| printed). ORT sessions run with
intra-op spinning off unless ``--spin`` (spinning pool threads of one session steal the core the
next configuration runs on; docs/ARCHITECTURE.md §8).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import onnx
import onnxruntime as ort

import ortfuse
from ortfuse import models
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.foundation.protocol import measure, ratio
from ortfuse.fusion import catalogue
from ortfuse.fusion.catalogue import spec_for_op_type
from ortfuse.fusion.rewrite import fuse
from ortfuse.kernel_choice import registry

PATTERNS = tuple(rule.id for rule in catalogue.RULES if rule.lowering)  # the patterns with lowering forms
DEFAULT_CASES = ("resnet50:1", "mobilenetv3_block:1", "mlp_gemm_relu_gelu:1", "mlp_gemm_relu_gelu:64", "bert_encoder:1")


# ---------------------------------------------------------------------------------------------
# cutting matches out of a zoo model
# ---------------------------------------------------------------------------------------------
def with_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """``model`` with every symbolic input dim set to ``batch`` and shapes inferred."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in list(out.graph.input) + list(out.graph.output):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                d.dim_value = batch
    del out.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(out)


def cut(model: onnx.ModelProto, names: list[str], tag: str) -> onnx.ModelProto:
    """The nodes ``names`` of ``model`` as a model of their own: their activation inputs become graph
    inputs, the initializers they read are copied; every name is prefixed with ``tag/``."""
    g = model.graph
    nodes = [n for n in g.node if n.name in set(names)]
    produced = {o for n in nodes for o in n.output}
    consumed = {i for n in nodes for i in n.input if i}
    inits = {t.name: t for t in g.initializer}
    types = {vi.name: vi for vi in list(g.value_info) + list(g.input) + list(g.output)}
    outside = {i for n in g.node if n.name not in set(names) for i in n.input} | {o.name for o in g.output}
    outputs = [o for o in produced if o not in consumed or o in outside]
    assert len(outputs) == 1, (names, outputs)

    def rn(x: str) -> str:
        return f"{tag}/{x}" if x else x

    new_nodes = []
    for n in nodes:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        c.name = rn(n.name)
        c.input[:] = [rn(i) for i in n.input]
        c.output[:] = [rn(o) for o in n.output]
        new_nodes.append(c)
    new_inits = []
    for name in sorted(consumed - produced):
        if name in inits:
            t = onnx.TensorProto()
            t.CopyFrom(inits[name])
            t.name = rn(name)
            new_inits.append(t)

    def vi(name: str) -> onnx.ValueInfoProto:
        v = onnx.ValueInfoProto()
        v.CopyFrom(types[name])
        v.name = rn(name)
        return v

    inputs = [vi(name) for name in sorted(consumed - produced - set(inits))]
    graph = onnx.helper.make_graph(new_nodes, tag, inputs, [vi(outputs[0])], initializer=new_inits)
    sub = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    sub.ir_version = model.ir_version
    return sub


def merge(parts: list[onnx.ModelProto]) -> onnx.ModelProto:
    """Disjoint models side by side in one graph (names are already distinct)."""
    graph = onnx.helper.make_graph([n for p in parts for n in p.graph.node], "group",
                                   [i for p in parts for i in p.graph.input],
                                   [o for p in parts for o in p.graph.output],
                                   initializer=[t for p in parts for t in p.graph.initializer])
    model = onnx.helper.make_model(graph, opset_imports=list(parts[0].opset_import))
    model.ir_version = parts[0].ir_version
    onnx.checker.check_model(model)
    return model


def op_and_epilogue(sub: onnx.ModelProto, pid: str) -> tuple[str, str]:
    fused, _ = fuse(sub, [pid], kernels="reference")
    node = next(n for n in fused.graph.node if n.domain == DOMAIN)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return spec_for_op_type(node.op_type).name, attrs.get("activation", b"").decode()


def groups_of(name: str, batch: int) -> dict[tuple[str, str, str], list[onnx.ModelProto]]:
    """(pattern id, op, epilogue) -> the cut-out matches of zoo model ``name`` at ``batch``."""
    model = with_batch(onnx.load(models.build(name)), batch)
    _, report = fuse(model, list(PATTERNS), kernels="reference")
    out: dict[tuple[str, str, str], list[onnx.ModelProto]] = {}
    for k, record in enumerate(report.fused):
        sub = cut(model, record.nodes, f"m{k}")
        op, act = op_and_epilogue(sub, record.pattern_id)
        out.setdefault((record.pattern_id, op, act), []).append(sub)
    return out


# ---------------------------------------------------------------------------------------------
# configurations of one group
# ---------------------------------------------------------------------------------------------
def options(spin: bool, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def kernel_choices(op: str, act: str, reference: bool) -> list[str]:
    """The ``fuse(kernels=...)`` values of every kernel the registry has for (op, epilogue)."""
    out = []
    for k in registry.kernels_for(op):
        if not k.serves(act):
            continue
        if k.path == registry.LOWERED:
            out.append(f"lowered:{k.form}")
        elif k.path == registry.NATIVE or (k.path == registry.REFERENCE and reference):
            out.append(k.path)
    return out


def bench_group(key, parts, args) -> dict:
    pid, op, act = key
    group = merge(parts)
    rng = np.random.default_rng(0)
    feeds = {}
    for vi in group.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    ref = ort.InferenceSession(group.SerializeToString(), options(True, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                               providers=["CPUExecutionProvider"]).run(None, feeds)
    sessions, labels, diffs, skipped = {}, {}, {}, {}
    for cfg in ("ort", "ort_aa"):
        sessions[cfg] = ort.InferenceSession(group.SerializeToString(), options(args.spin),
                                             providers=["CPUExecutionProvider"])
    for choice in kernel_choices(op, act, args.reference):
        fused, report = fuse(group, [pid], kernels=choice)
        if len(report.fused) != len(parts):
            why = {m.reason for m in report.matches if m.decision != "fused"}
            skipped[choice] = "; ".join(sorted(why))[:160]
            continue
        labels[choice] = sorted({m.kernel for m in report.fused})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sessions[choice] = ortfuse.InferenceSession(fused.SerializeToString(), options(args.spin),
                                                        providers=["CPUExecutionProvider"])
    for cfg, sess in sessions.items():
        got = sess.run(None, feeds)
        diffs[cfg] = max(float(np.abs(g - r).max()) for g, r in zip(got, ref))
    runners = {cfg: (lambda s=s: s.run(None, feeds)) for cfg, s in sessions.items()}
    lat = measure(runners, runs=args.runs, repeats=args.repeats, warmup=2, gap_s=args.gap_ms / 1000)
    p50 = {cfg: statistics.median(statistics.median(rep) for rep in v) for cfg, v in lat.items()}
    return {"pattern": pid, "op": op, "epilogue": act or "none", "count": len(parts),
            "p50_ms": p50, "over_ort": {cfg: ratio(lat[cfg], lat["ort"]) for cfg in lat},
            "aa": ratio(lat["ort_aa"], lat["ort"]), "max_abs_diff": diffs, "labels": labels, "skipped": skipped}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", help="NAME:BATCH (repeatable); default: " + " ".join(DEFAULT_CASES))
    ap.add_argument("--runs", type=int, default=10, help="timed passes per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gap-ms", type=float, default=0.0, help="idle sleep before every single run")
    ap.add_argument("--spin", action="store_true", help="keep ORT's intra-op spinning on")
    ap.add_argument("--no-reference", dest="reference", action="store_false", help="skip the numpy reference path")
    ap.add_argument("--only", default="", help="comma-separated OP/EPILOGUE filters, e.g. FusedConvAct/hardswish")
    ap.add_argument("--json", help="also write the rows as JSON to this path")
    args = ap.parse_args(argv)
    only = {s for s in args.only.split(",") if s}
    env = {"onnxruntime": ort.__version__, "cpus": os.cpu_count(), "loadavg_before": os.getloadavg(),
           "spin": args.spin, "runs": args.runs, "repeats": args.repeats, "gap_ms": args.gap_ms}
    rows = []
    for case in args.case or DEFAULT_CASES:
        name, batch = case.split(":")
        for key, parts in groups_of(name, int(batch)).items():
            if only and f"{key[1]}/{key[2] or 'none'}" not in only:
                continue
            row = {"model": name, "batch": int(batch), **bench_group(key, parts, args)}
            rows.append(row)
            cfgs = [c for c in row["p50_ms"] if c not in ("ort", "ort_aa")]
            print(f"{name}:{batch} {row['op']}/{row['epilogue']} x{row['count']}  ort {row['p50_ms']['ort']:.3f} ms  "
                  f"A/A {row['aa']:.3f}  " + "  ".join(f"{c} {row['over_ort'][c]:.3f}" for c in cfgs),
                  file=sys.stderr, flush=True)
    env["loadavg_after"] = os.getloadavg()
    print(f"onnxruntime {env['onnxruntime']} ORT_ENABLE_ALL, spinning {'on' if args.spin else 'off'}, "
          f"{args.repeats} repeats x {args.runs} interleaved runs, gap {args.gap_ms} ms; load average "
          f"{env['loadavg_before'][0]:.2f} before, {env['loadavg_after'][0]:.2f} after")
    print()
    print("| model:batch | op / epilogue | n | ORT unfused ms | A/A | configuration | ms | /ORT | max abs diff |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|")
    for r in rows:
        first = True
        for cfg, ms in r["p50_ms"].items():
            if cfg in ("ort", "ort_aa"):
                continue
            lead = (f"| {r['model']}:{r['batch']} | {r['op']} / {r['epilogue']} | {r['count']} | "
                    f"{r['p50_ms']['ort']:.3f} | {r['aa']:.3f} ") if first else "| | | | | "
            print(f"{lead}| {cfg} | {ms:.3f} | {r['over_ort'][cfg]:.3f} | {r['max_abs_diff'][cfg]:.1e} |")
            first = False
        for cfg, why in r["skipped"].items():
            print(f"| | | | | | {cfg} | - | - | not applicable: {why} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
