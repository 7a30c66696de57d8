"""The text report of ``ortfuse profile``."""

from __future__ import annotations

from ortfuse.profiling.openvino_counters import OpenVinoProfile
from ortfuse.profiling.run import FUSED, LABELS, ProfileResult

PEER = "OpenVINO f32"


def _ms(us: float) -> str:
    return f"{us / 1000:.3f}"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"


def _table(rows: list[tuple]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    return [("  ".join(str(c).ljust(w) for c, w in zip(r[:-1], widths)) + "  " + str(r[-1])).rstrip() for r in rows]


def format_text(r: ProfileResult, top: int = 10) -> str:
    """The human-readable report the CLI prints."""
    lines = [f"ortfuse profile {r.model}",
             "inputs: " + ", ".join(f"{k} {v['dtype']}{v['shape']}" for k, v in r.inputs.items())
             + f"; {r.runs} runs per configuration after {r.warmup} warm-up, interleaved; intra-op spinning off; "
               "medians per run",
             f"fusion: {r.fusion_reason}", ""]
    rows: list[tuple] = [("configuration", "run (ms)", "in kernels (ms)", "node total (ms)", "nodes")]
    for p in r.profiles.values():
        rows.append((LABELS[p.config], _ms(p.run_us), _ms(p.kernel_run_us), _ms(p.node_us), len(p.nodes)))
    ov = r.peer
    if ov is not None:
        rows.append((f"{PEER}, counters off", _ms(ov.wall_us), "-", "-", "-"))
        rows.append((f"{PEER}, PERF_COUNT on", _ms(ov.counters_wall_us), _ms(ov.layers_run_us), _ms(ov.layer_us),
                     len(ov.layers)))
    lines += _table(rows)
    lines.append("(run: median model_run; in kernels: median of each run's summed node times; node total: sum of "
                 "the nodes' medians, which the tables below split)")
    if ov is not None:
        lines.append(f"({PEER}: run is the wall-clock time of one infer() call; the model with counters off is the "
                     "one to compare with ORT's runs. Its per-layer counters (real_time) come from the PERF_COUNT "
                     "model and need not add up to its wall time: its shares below are of its layer total)")
    lines += ["", "time per op type (ms per run, share of the node total)"]
    cols = [(LABELS[p.config], p.by_op_type()[:top], p.node_us) for p in r.profiles.values()]
    if ov is not None:
        cols.append((f"{PEER} (layer types)", ov.by_layer_type()[:top], ov.layer_us))
    cells = [[f"{op} x{n}  {_ms(us)}  {_pct(us, total)}" for op, us, n in types] for _, types, total in cols]
    width = max([len(c[0]) for c in cols] + [len(x) for col in cells for x in col]) + 3
    lines.append("".join(c[0].ljust(width) for c in cols).rstrip())
    for i in range(max(len(c) for c in cells)):
        lines.append("".join((col[i] if i < len(col) else "").ljust(width) for col in cells).rstrip())
    for p in r.profiles.values():
        lines += ["", f"hottest nodes: {LABELS[p.config]}"]
        rows = [("node", "op", "ms", "share", "stands for")]
        for n in p.nodes[:top]:
            if n.fused_op:
                part = "" if n.fused_op == n.name else f"part of {n.fused_op}, "
                what = f"{n.pattern_id}: {part}replaces {','.join(n.replaced)}"
            elif n.spans:
                what = f"the work of {','.join(n.spans)} and more ({n.how})"
            else:
                what = ",".join(n.maps_to) + f" ({n.how})" if n.maps_to else n.how
            rows.append((n.name, n.op_type, _ms(n.us), _pct(n.us, p.node_us), what[:100]))
        lines += _table(rows)
    for a in r.attributions:
        lines += ["", (f"saving per pattern against {LABELS[a.config]} (original nodes' time minus the fused "
                       "ops' time; positive: ortfuse is faster)")]
        if not a.patterns:
            lines.append("no fused op")
        else:
            rows = [("pattern", "fused ops", "mapped", "fused (ms)", "original (ms)", "saving (ms)")]
            for s in a.patterns:
                mapped = f"{s.mapped}/{s.ops}" + (f" ({s.shared} in shared layout ops)" if s.shared else "")
                rows.append((s.pattern_id, s.ops, mapped, _ms(s.fused_mapped_us),
                             _ms(s.original_us) if s.mapped else "unmapped",
                             _ms(s.saving_us) if s.mapped else "unmapped"))
            lines += _table(rows)
        for config, split in ((FUSED, a.fused_split), (a.config, a.stock_split)):
            total = r.profiles[config].node_us
            detail = ", ".join(f"{k} {_ms(v)}" for k, v in list(split.unmapped.items())[:4])
            fused_part = f"{_ms(split.fused_ops_us)} ms in fused ops, " if config == FUSED else ""
            lines.append(f"{LABELS[config]}: {fused_part}{_ms(split.left_unfused_us)} ms in nodes ortfuse leaves "
                         f"unfused, {_ms(split.unmapped_us)} ms ({_pct(split.unmapped_us, total)}) unmapped"
                         + (f": {detail}" if detail else ""))
    if ov is not None:
        lines += _peer_lines(ov, top)
    lines += [""] + [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


def _peer_lines(ov: OpenVinoProfile, top: int) -> list[str]:
    """OpenVINO's kernels, hottest layers, and what it runs as one layer beside ortfuse."""
    lines = ["", f"{PEER} {ov.version}: precision {ov.precision}, {ov.threads} threads, one stream; "
                 "kernels (layer type, exec_type; ms per run, share of its layer total)"]
    rows: list[tuple] = [("kernel", "layers", "ms", "share")]
    rows += [(k, n, _ms(us), _pct(us, ov.layer_us)) for k, us, n in ov.by_exec_type()[:top]]
    lines += _table(rows)
    lines += ["", f"hottest layers: {PEER} (~: ONNX node placed by position, see --json 'by_position')"]
    rows = [("layer", "type", "kernel", "ms", "share", "does (ONNX nodes)")]
    for n in ov.layers[:top]:
        does = ",".join(("~" if c in n.by_position else "") + c for c in n.covers) or "-"
        rows.append((n.name[:40], n.layer_type, n.exec_type, _ms(n.us), _pct(n.us, ov.layer_us), does[:100]))
    lines += _table(rows)
    mapped = sum(len(n.covers) for n in ov.layers)
    placed = sum(len(n.by_position) for n in ov.layers)
    left = ", ".join(f"{op} x{n}" for op, n in ov.uncovered_ops.items())
    lines += ["", f"{PEER} layers doing several ONNX nodes, and how ortfuse runs the same nodes ({mapped} of "
                  f"{mapped + len(ov.uncovered)} ONNX nodes but Constant mapped to a layer, {placed} by position; "
                  f"{len(ov.uncovered)} in no executed layer: folded, optimized out or not recovered"
                  + (f": {left})" if left else ")")]
    if not ov.fusions:
        lines.append("none")
        return lines
    rows = [("layers", "type", "ONNX ops", "ms", "ortfuse")]
    rows += [(f.count, f.layer_type, f.onnx_ops, _ms(f.us), f.ortfuse) for f in ov.fusions]
    lines += _table(rows)
    gaps = [f for f in ov.fusions if f.ortfuse_kernels > 1]
    if gaps:
        lines += ["", f"{PEER} fuses what ortfuse runs as several kernels:"]
        lines += [f"  {PEER}: {f.count} {f.onnx_ops} as one {f.layer_type}; ortfuse: {f.ortfuse}" for f in gaps]
    if any("*" in f.ortfuse for f in ov.fusions):
        lines.append("(*: no kernel of its own in ortfuse's ORT profile: ORT runs it inside one of its own fused "
                     "kernels, or folded it)")
    if any("+...)" in f.ortfuse for f in ov.fusions):
        lines.append("(+...: the fused op also does nodes of other OpenVINO layers, e.g. an affine step folded into "
                     "the next conv's input)")
    return lines
