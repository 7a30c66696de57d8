"""What ``ortfuse bench`` prints and writes: the header, one table per (model, batch), and the JSON
result file (raw latencies, environment, protocol, summary rows)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import numpy as np

from ortfuse.bench.environment import QUIET_THREADS_ENV
from ortfuse.bench.sessions import BASELINE, CONFIGS, CONTROL, REFERENCE
from ortfuse.bench.stats import noise_band


def header(doc: dict) -> str:
    """First line: machine and protocol; then threads/memory and versions."""
    env, prot = doc["environment"], doc["protocol"]
    load = env.get("load_average_1_5_15")
    machine = (
        f"{env['cpu_model']}, {env['logical_cores']} logical cores ({env['physical_cores']} physical, "
        f"{env['usable_cores']} usable), {platform.system()} {platform.machine()}"
        + (f" ({' '.join(env['isa_features'])})" if env.get("isa_features") else "")
        + (f", load {load[0]:.2f}" if load else "")
    )
    runs = f"{prot['runs']} timed" if prot["runs"] != "auto" else f"auto (~{prot['auto_runs_budget_s']:.0f} s) timed"
    line1 = (
        f"ortfuse bench | machine: {machine} | protocol: {prot['order']}; "
        f"{prot['warmup_passes_per_repeat']} warm-up + {runs} passes per repeat, {prot['repeats']} repeats; "
        f"ratio = median over repeats of p50(config)/p50({BASELINE})"
        + (f", A/A control = {prot['control']}" if prot["control"] else "")
    )
    spin = (
        "ORT spinning off on every session (session.intra_op/inter_op.allow_spinning=0)"
        if not prot["spinning"]
        else "ORT spinning on (default) on every session"
    )
    gap = f"idle gap {prot['gap_ms']:g} ms before every run" if prot["gap_ms"] else "no idle gap"
    if prot.get("block", 1) > 1:
        gap += f"; each block after an idle {prot['settle_ms']:g} ms and one untimed run"
    mem = {
        "subprocess": "peak MB = RSS high-water mark growth over session creation + 3 runs, "
        "each config alone in a child process",
        "inprocess": "peak MB = RSS growth over session creation + first run in the bench process (rough)",
        "off": "memory not measured",
    }[prot["memory"]]
    v = env["versions"]
    others = (
        "OpenMP/OpenBLAS threads told not to spin (" + " ".join(f"{k}={v}" for k, v in QUIET_THREADS_ENV.items()) + ")"
        if prot.get("quiet_threads")
        else "OpenMP/OpenBLAS threads as configured by the environment"
    )
    line2 = f"threads: {spin}, {gap}, intra_op_num_threads={prot['intra_op_num_threads']}; {others}; memory: {mem}"
    openvino = f", openvino {v['openvino']}" if v.get("openvino", "not installed") != "not installed" else ""
    line3 = (
        f"versions: ortfuse {v['ortfuse']}, onnxruntime {v['onnxruntime']}, onnx {v['onnx']}, numba {v['numba']}, "
        f"numpy {v['numpy']}{openvino}, python {env['python']}; {env['date']}"
    )
    lines = [line1, line2, line3]
    if doc.get("suite"):
        lines.append(f"suite: {doc['suite']}" + (f" ({len(doc['skipped'])} model(s) not measured, named above)"
                                                 if doc.get("skipped") else ""))
    if load and env.get("usable_cores") and load[0] > 0.75 * env["usable_cores"]:
        lines.append(
            f"warning: load average {load[0]:.1f} on {env['usable_cores']} cores: other processes compete for the CPU; "
            "absolute latencies are inflated, read ratios against the A/A control"
        )
    return "\n".join(lines)


def _fmt(x, spec: str, none: str = "-") -> str:
    if x is None:
        return none
    if isinstance(x, float) and not np.isfinite(x):
        return "inf"
    return format(x, spec)


def _peak_mb(row: dict, memory: str):
    if memory == "subprocess":
        m = row.get("memory") or {}
        return m.get("peak_delta_mb")
    if memory == "inprocess":
        return row.get("rss_inprocess_mb")
    return None


def _fused(row: dict, name: str) -> str:
    if CONFIGS[name].stock:
        return "-"
    counts = row.get("fused_ops") or {}
    if not counts:
        return "0"
    return ",".join(f"{k}:{v}" for k, v in counts.items())


def _diff(row: dict, name: str) -> str:
    d = row.get("max_abs_diff")
    if name == REFERENCE:
        return "0 (ref)"
    if d is None:
        return "-"
    if not np.isfinite(d):
        return "inf"
    return "0" if d == 0 else f"{d:.2e}"


def table(result: dict, memory: str = "subprocess") -> str:
    """The readable table of one (model, batch) result."""
    ins = ", ".join(f"{k}{v['shape']} {v['dtype']}" for k, v in result["inputs"].items())
    title = f"== {result['model']}" + (f" ({result['description']})" if result.get("description") else "")
    title += f" | batch {result['batch']} | {ins} | {result['runs']} runs x {result['repeats']} repeats"
    ctrl = result.get("control")
    cols = [
        "config",
        "p50 ms",
        "p99 ms",
        "samples/s",
        f"p50/{BASELINE} [repeats]",
        "A/A ctrl",
        "verdict",
        "max|diff|",
        "peak MB",
        "create s",
        "fused ops",
    ]
    rows = []
    for name, row in result["configs"].items():
        rr = row.get("ratio_per_repeat") or []
        if name == BASELINE:
            ratio_txt = "1 (baseline)"
        else:
            ratio_txt = f"{row['ratio']:.3f} [{min(rr):.3f}-{max(rr):.3f}]"
        rows.append(
            [
                name,
                _fmt(row["p50_ms"], ".3f"),
                _fmt(row["p99_ms"], ".3f"),
                _fmt(row["throughput_per_s"], ".1f"),
                ratio_txt,
                _fmt(ctrl["ratio"], ".3f") if ctrl else "n/a",
                row.get("verdict") or "",
                _diff(row, name),
                _fmt(_peak_mb(row, memory), ".1f"),
                _fmt(row.get("create_s"), ".3f"),
                _fused(row, name),
            ]
        )
    widths = [max(len(str(r[i])) for r in [cols] + rows) for i in range(len(cols))]
    right = {1, 2, 3, 5, 7, 8, 9}

    def line(cells):
        return "  ".join(
            str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    out = [title, line(cols), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    if ctrl:
        rr = ctrl["ratio_per_repeat"]
        out.append(
            f"A/A control: {CONTROL}/{BASELINE} = {ctrl['ratio']:.3f} (repeats {min(rr):.3f}-{max(rr):.3f}), "
            f"noise band {noise_band(rr)[0]:.3f}-{noise_band(rr)[1]:.3f}: verdict faster/slower only when every "
            f"repeat's ratio lies outside it."
        )
    for name, row in result["configs"].items():
        if not CONFIGS[name].stock and row.get("fusion_reason"):
            state = "applied" if row.get("fusion_applied") else "not applied"
            out.append(f"note: {name}: fusion {state}: {row['fusion_reason']}")
        if row.get("tune_s") is not None:
            tuned = f"measured ahead in {row['tune_s']:.1f} s" if row["tune_s"] else "cached"
            out.append(f"note: {name}: auto decisions {tuned} (`ortfuse tune`); create s is with them cached")
        for w in row.get("warnings") or []:
            out.append(f"note: {name}: warning: {w}")
        mem = row.get("memory") or {}
        if mem.get("error"):
            out.append(f"note: {name}: memory: {mem['error']}")
    for n in result.get("notes") or []:
        out.append(f"note: {n}")
    return "\n".join(out)


def _json_safe(obj):
    """Strict JSON: non-finite floats (an infinite max |diff|) become strings."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        return _json_safe(obj.item())
    return obj


def summary_rows(doc: dict) -> list[dict]:
    """One flat row per (model, batch, config): the numbers of the printed tables."""
    rows = []
    for res in doc["results"]:
        ctrl = res.get("control")
        for name, row in res["configs"].items():
            rows.append(
                {
                    "model": res["model"],
                    "batch": res["batch"],
                    "config": name,
                    "p50_ms": row["p50_ms"],
                    "p99_ms": row["p99_ms"],
                    "throughput_per_s": row["throughput_per_s"],
                    "ratio": row.get("ratio"),
                    "aa_control_ratio": ctrl["ratio"] if ctrl else None,
                    "verdict": row.get("verdict"),
                    "max_abs_diff": row.get("max_abs_diff"),
                    "max_rel_diff": row.get("max_rel_diff"),
                    "peak_mb": _peak_mb(row, doc["protocol"]["memory"]),
                    "create_s": row.get("create_s"),
                    "fused_ops": row.get("fused_ops"),
                }
            )
    return rows


def write_json(doc: dict, path: str) -> None:
    doc = dict(doc)
    doc["summary"] = summary_rows(doc)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(_json_safe(doc), f, indent=1, allow_nan=False)
        f.write("\n")


def result_path(doc: dict, target: str) -> str:
    """Where ``--json TARGET`` writes: TARGET itself, or, when TARGET is a folder (an existing one, or
    a path ending in a slash), ``TARGET/bench-<models>-<date>.json`` there (``bench-<suite>-<date>.json``
    for a ``--suite`` run; ``-2``, ``-3``... when that name is taken): the naming of
    ``benchmarks/results/`` (docs/ARCHITECTURE.md §8)."""
    models = "+".join(dict.fromkeys(Path(res["model"]).stem for res in doc["results"])) or "none"
    return result_file(target, f"bench-{doc.get('suite') or models}-{str(doc['environment']['date'])[:10]}")


def result_file(target: str, stem: str) -> str:
    """``--json TARGET`` of any tool: TARGET itself, or, when TARGET is a folder (an existing one, or a
    path ending in a slash, created), ``TARGET/<stem>.json`` there, ``<stem>-2.json``, ``-3``... when
    that name is taken by an earlier run (benchmarks/results/README.md)."""
    if not (os.path.isdir(target) or target.endswith(("/", os.sep))):
        return target
    os.makedirs(target, exist_ok=True)
    path, n = os.path.join(target, stem + ".json"), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(target, f"{stem}-{n}.json")
    return path


MAX_RESULT_BYTES = 2 << 20  # the repository's limit per file: a larger result file is written gzipped


def save_result(doc: dict, target: str, stem: str, compact: bool = False) -> str:
    """Write ``doc`` as indented JSON where ``--json TARGET`` says (``result_file``); returns the path.
    ``compact``: no indentation (a result with thousands of raw rows), and gzipped (``.gz`` appended)
    when over ``MAX_RESULT_BYTES`` (benchmarks/results/README.md)."""
    path = Path(result_file(target, stem))
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, separators=(",", ":")) if compact else json.dumps(doc, indent=1)
    if compact and len(text) > MAX_RESULT_BYTES:
        import gzip

        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return str(path)
