"""``ortfuse profile MODEL``: ORT's own profiler on the fused and the unfused model, side by side.

Contract:
- Configurations: ``fused`` (``ortfuse.InferenceSession(fusion=True)``, ORT_ENABLE_ALL behind it),
  ``ort_enable_all`` (stock ORT, what the user would otherwise run) and, on request,
  ``ort_disable_all``. Every session has ORT's profiler on (``SessionOptions.enable_profiling``) and
  intra-op spinning off (docs/ARCHITECTURE.md §8: a neighbour's spinning threads would inflate the times);
  runs are interleaved A B B A, the first ``warmup`` runs of each session are not counted.
- Times come from the trace ``end_profiling()`` writes: events of cat ``Node`` named
  ``<node>_kernel_time`` (``dur`` in us, ``args.op_name``) that fall inside a counted ``model_run``
  event. A node's time is the median over counted runs of its time in each run (medians: on shared
  CPUs a few disturbed runs would dominate a mean); the run time is the median ``model_run``.
- Attribution: a profiled node is resolved to a node of the graph ORT was given (the original
  model, or for ``fused`` the rewritten one the session loaded) by its exact name, by ORT's naming of
  its rewrites (``fused <node>``, ``<tensor>_nchwc`` for NCHWc convs, ``<node>/<Name>Fusion/``,
  ``_token_<k>`` suffixes), or, for stock ENABLE_ALL, by the producers of the tensors it outputs in
  ORT's optimized graph (saved by a separate stock session). A fused op is every rewritten node
  named after it (``<fused_node>`` or ``<fused_node>/<k>``), with its pattern id and replaced
  nodes from ``session.fusion_report``. Layout reorders and anything else stay "unmapped"; nothing
  is guessed or split.
- Saving of a pattern: over its fused ops whose original nodes were found in the stock profile,
  the stock time of those nodes minus the fused ops' time (positive: ortfuse is faster). Unmapped
  time (e.g. NCHWc reorders) is shown per configuration, outside the savings.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field

import numpy as np

from ortfuse.cli.common import add_input_arguments, command_inputs, default_patterns
from ortfuse.foundation.session_options import make_options
from ortfuse.layout import replaced_nodes

CPU = ["CPUExecutionProvider"]
FUSED, ENABLE_ALL, DISABLE_ALL = "fused", "ort_enable_all", "ort_disable_all"
LABELS = {FUSED: "ortfuse fused", ENABLE_ALL: "stock ORT_ENABLE_ALL", DISABLE_ALL: "stock ORT_DISABLE_ALL"}
KERNEL_SUFFIX = "_kernel_time"
REORDER_OPS = {"ReorderInput", "ReorderOutput"}


class ProfileError(Exception):
    """A usage problem (unreadable model, bad option); the CLI prints it and exits with 2."""


# --------------------------------------------------------------------------- traces


@dataclass
class NodeTime:
    """One node of a profile: median time per counted run (us), and what it stands for."""

    name: str
    op_type: str
    us: float
    calls: float = 1.0  # events per counted run
    maps_to: list[str] = field(default_factory=list)  # nodes of the graph ORT was given it stands for
    how: str = ""  # how the mapping was made, or "unmapped"
    fused_op: str = ""  # fused configuration: the fused op (report's fused_node) this node belongs to
    pattern_id: str = ""
    replaced: list[str] = field(default_factory=list)  # the fused op's original nodes
    spans: list[str] = field(default_factory=list)  # fused ops a layout op does together (time not split)


@dataclass
class Profile:
    """One configuration's profile: ``run_us`` is the median ``model_run`` time, ``nodes`` hottest first;
    ``node_us`` (the sum of the nodes' medians) need not equal the median of the runs' node sums."""

    config: str
    runs: int
    warmup: int
    run_us: float
    nodes: list[NodeTime]
    kernel_run_us: float = 0.0  # median over counted runs of the run's summed node times
    trace: str = ""

    @property
    def node_us(self) -> float:
        return float(sum(n.us for n in self.nodes))

    def by_op_type(self) -> list[tuple[str, float, int]]:
        """(op type, us per run, node count), hottest first; the times sum to ``node_us``."""
        acc: dict[str, list] = {}
        for n in self.nodes:
            row = acc.setdefault(n.op_type, [0.0, 0])
            row[0] += n.us
            row[1] += 1
        return sorted(((k, v[0], v[1]) for k, v in acc.items()), key=lambda r: -r[1])


def read_trace(events: list[dict], warmup: int) -> tuple[dict[str, tuple[str, list[float], int]], int, float]:
    """Collect the node events of the counted runs of one trace.

    Returns ({node name: (op type, its us in each counted run, event count)}, counted runs,
    median model_run us)."""
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    counted = runs[warmup:]
    if not counted:
        raise ProfileError(f"the trace holds {len(runs)} run(s), none after the {warmup} warm-up run(s)")
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in counted]
    starts = np.array([w[0] for w in windows])
    per_node: dict[str, tuple[str, list[float], int]] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith(KERNEL_SUFFIX):
            continue
        i = int(np.searchsorted(starts, e["ts"], side="right")) - 1
        if i < 0 or e["ts"] > windows[i][1]:
            continue  # a warm-up run's node
        name = e["name"][: -len(KERNEL_SUFFIX)]
        if name not in per_node:
            per_node[name] = (e.get("args", {}).get("op_name", "?"), [0.0] * len(counted), 0)
        op, times, count = per_node[name]
        times[i] += float(e["dur"])
        per_node[name] = (op, times, count + 1)
    return per_node, len(counted), float(np.median([e["dur"] for e in counted]))


# --------------------------------------------------------------------------- name mapping


class NameMap:
    """Maps node names of an ORT profile back to nodes of the original model (see the contract)."""

    _FUSION = re.compile(r"^(.+?)/\w*Fusion/")
    _TOKEN = re.compile(r"_token_\d+$")

    def __init__(self, model, optimized=None) -> None:
        from ortfuse.ir.graph import GraphIndex

        ix = GraphIndex(model, infer_shapes=False)
        self.names = {ix.name_of(n) for n in model.graph.node}
        self.producer = {o: ix.name_of(n) for n in model.graph.node for o in n.output if o}
        # ORT's optimized graph (same node names as its profile): node name -> its output tensors
        self.outputs = {n.name: [o for o in n.output if o] for n in optimized.graph.node} if optimized else {}
        # a layout op names the nodes of ORT's graph it replaces (ortfuse.layout.replaced_nodes)
        self.replaces = {n.name: replaced_nodes.replaced(n) for n in optimized.graph.node} if optimized else {}

    def resolve(self, name: str, op_type: str) -> tuple[list[str], str]:
        if self.replaces.get(name):
            found = {t for r in self.replaces[name] for t in self._resolve(r, "")[0]}
            found |= {self.producer[o] for o in self.outputs.get(name, ()) if o in self.producer}
            if found:
                return sorted(found), "ortfuse layout op (the nodes it replaces)"
        return self._resolve(name, op_type)

    def _resolve(self, name: str, op_type: str) -> tuple[list[str], str]:
        if name in self.names:
            return [name], "same name"
        base = self._TOKEN.sub("", name)
        if base in self.names:
            return [base], "ORT-renamed (_token suffix)"
        if base.startswith("fused ") and base[6:] in self.names:
            return [base[6:]], "ORT fusion (fused <node>)"
        if base.endswith("_nchwc") and base[:-6] in self.producer:
            return [self.producer[base[:-6]]], "ORT NCHWc conv (named after its output)"
        m = self._FUSION.match(base)
        if m and m.group(1) in self.names:
            return [m.group(1)], "ORT fusion (<node>/...Fusion/)"
        if op_type not in REORDER_OPS:
            found = sorted({self.producer[o] for o in self.outputs.get(name, ()) if o in self.producer})
            if found:
                return found, "ORT node producing the original tensor"
        return [], "unmapped" + (" (NCHWc layout reorder)" if op_type in REORDER_OPS else "")


# --------------------------------------------------------------------------- running


def _options(level: str, prefix: str | None):
    so = make_options(level, spinning=False)
    if prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = prefix
    return so


def _ort_optimized_graph(model_bytes: bytes, folder: str):
    """ORT's ENABLE_ALL graph of the model (node names as its profile shows them), or None."""
    import onnx
    import onnxruntime as ort

    so = _options("ORT_ENABLE_ALL", None)
    so.optimized_model_filepath = os.path.join(folder, "ort_optimized.onnx")
    so.log_severity_level = 3  # ORT warns that an NCHWc graph is hardware specific: known, not news
    try:
        ort.InferenceSession(model_bytes, so, providers=CPU)
        return onnx.load(so.optimized_model_filepath)
    except Exception:  # noqa: BLE001 - an optional aid: without it nodes are mapped by name only
        return None


@dataclass
class PatternSaving:
    """Per pattern: fused ops, how many were found in both profiles (mapped), how many run inside a
    layout op shared with other fused ops (shared: never mapped, the op's time is not split), times in
    us per run."""

    pattern_id: str
    ops: int
    mapped: int
    fused_us: float  # every fused op of the pattern
    fused_mapped_us: float  # the mapped ones only
    original_us: float  # stock time of the mapped ops' original nodes
    saving_us: float  # original_us - fused_mapped_us
    shared: int = 0


@dataclass
class Split:
    """How one profile's node time splits: fused ops (fused configuration), nodes that stand for
    original nodes ortfuse left unfused, and unmapped nodes (by op type)."""

    fused_ops_us: float = 0.0
    left_unfused_us: float = 0.0
    unmapped_us: float = 0.0
    unmapped: dict[str, float] = field(default_factory=dict)

    def add_unmapped(self, key: str, us: float) -> None:
        self.unmapped_us += us
        self.unmapped[key] = self.unmapped.get(key, 0.0) + us


@dataclass
class Attribution:
    """Savings per pattern against one stock configuration, and how both profiles' time splits."""

    config: str
    patterns: list[PatternSaving]
    fused_split: Split
    stock_split: Split


def attribute(fused: Profile, stock: Profile, matches: list) -> Attribution:
    """Match the fused ops (``matches``: the report's fused MatchRecords) with the stock nodes
    standing for their original nodes."""
    owner = {orig: m.fused_node for m in matches for orig in m.nodes}
    fused_time: dict[str, float] = {}
    shared: set[str] = set()
    fsplit = Split()
    for node in fused.nodes:
        if node.fused_op:
            fsplit.fused_ops_us += node.us
            fused_time[node.fused_op] = fused_time.get(node.fused_op, 0.0) + node.us
        elif node.spans:
            fsplit.fused_ops_us += node.us
            shared.update(node.spans)
        elif node.maps_to:
            fsplit.left_unfused_us += node.us
        else:
            fsplit.add_unmapped(node.op_type, node.us)
    stock_time: dict[str, float] = {}
    ssplit = Split()
    for node in stock.nodes:
        owners = {owner.get(o) for o in node.maps_to}
        if owners == {None}:
            ssplit.left_unfused_us += node.us
        elif len(owners) == 1 and None not in owners:
            name = str(owners.pop())
            stock_time[name] = stock_time.get(name, 0.0) + node.us
        else:  # no original node found, or several owners: not split by guesswork
            ssplit.add_unmapped(node.op_type if not node.maps_to
                                else f"{node.op_type} (spans a fused op and other nodes)", node.us)
    rows: dict[str, PatternSaving] = {}
    for m in matches:
        row = rows.setdefault(m.pattern_id, PatternSaving(m.pattern_id, 0, 0, 0.0, 0.0, 0.0, 0.0))
        us = fused_time.get(m.fused_node, 0.0)
        row.ops += 1
        row.fused_us += us
        row.shared += m.fused_node in shared
        if m.fused_node in stock_time and m.fused_node in fused_time:  # found in both profiles
            row.mapped += 1
            row.fused_mapped_us += us
            row.original_us += stock_time[m.fused_node]
    for row in rows.values():
        row.saving_us = row.original_us - row.fused_mapped_us
    for split in (fsplit, ssplit):
        split.unmapped = dict(sorted(split.unmapped.items(), key=lambda kv: -kv[1]))
    return Attribution(stock.config, sorted(rows.values(), key=lambda r: -r.fused_us), fsplit, ssplit)


@dataclass
class ProfileResult:
    """Everything ``profile`` measured; ``to_dict`` is the ``--json`` schema."""

    model: str
    inputs: dict[str, dict]
    runs: int
    warmup: int
    profiles: dict[str, Profile]
    attributions: list[Attribution]
    fusion_reason: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def profile(model, feeds: dict[str, np.ndarray], runs: int = 10, warmup: int = 1, patterns=None,
            disable_all: bool = False, trace_dir: str | None = None, label: str = "") -> ProfileResult:
    """Profile ``model`` (an ``onnx.ModelProto``) fused and unfused on ``feeds``.

    Raw traces are kept in ``trace_dir`` as ``<config>.json`` when it is given."""
    import onnxruntime as ort

    import ortfuse

    if runs < 1 or warmup < 0:
        raise ProfileError("--runs must be at least 1 and --warmup not negative")
    data = model.SerializeToString()
    out_names = [o.name for o in model.graph.output]
    with tempfile.TemporaryDirectory(prefix="ortfuse-profile-") as tmp:
        sessions = {}
        sessions[FUSED] = ortfuse.InferenceSession(data, _options("ORT_ENABLE_ALL", os.path.join(tmp, FUSED)),
                                                   providers=CPU, fusion=True, fusion_patterns=patterns)
        sessions[ENABLE_ALL] = ort.InferenceSession(data, _options("ORT_ENABLE_ALL", os.path.join(tmp, ENABLE_ALL)),
                                                    providers=CPU)
        if disable_all:
            sessions[DISABLE_ALL] = ort.InferenceSession(
                data, _options("ORT_DISABLE_ALL", os.path.join(tmp, DISABLE_ALL)), providers=CPU)
        order = list(sessions)
        for i in range(warmup + runs):  # A B B A: each session runs first as often as last
            for name in (order if i % 2 == 0 else order[::-1]):
                sessions[name].run(out_names, feeds)
        traces = {name: s.end_profiling() for name, s in sessions.items()}
        report = sessions[FUSED].fusion_report
        optimized = _ort_optimized_graph(data, tmp)
        loaded = _loaded_model(sessions[FUSED], model) if report.applied else model
        # names of fused ops come from the rewrite; a planned layout (ORT's optimised graph) renames
        # its nodes after their outputs, which the rewrite's producers resolve (docs/ARCHITECTURE.md §9)
        rewritten = ortfuse.fuse(model, patterns)[0] if report.applied else model
        profiles = {}
        for name, path in traces.items():
            with open(path) as fh:
                events = json.load(fh)
            totals, counted, run_us = read_trace(events, warmup)
            if name == FUSED:
                nodes = _nodes(totals, counted, NameMap(rewritten, loaded), report.fused if report.applied else [])
            else:
                nodes = _nodes(totals, counted, NameMap(model, optimized if name == ENABLE_ALL else None), [])
            per_run = np.sum([times for _, times, _ in totals.values()], axis=0) if totals else [0.0]
            profiles[name] = Profile(name, counted, warmup, run_us, nodes, float(np.median(per_run)))
            if trace_dir is not None:
                os.makedirs(trace_dir, exist_ok=True)
                kept = os.path.join(trace_dir, f"{name}.json")
                shutil.copyfile(path, kept)
                profiles[name].trace = kept
    notes = [("ORT fuses and renames nodes at ENABLE_ALL: a node whose kernel also does the work of nodes "
              "outside a fused op (e.g. a residual Add folded into a Conv) is attributed by its name or output, "
              "so a pattern's time (stock or fused) can include such neighbours")]
    if optimized is None:
        notes.append("ORT's optimized graph could not be saved: stock nodes are mapped by name only")
    if not report.applied:
        notes.append(f"nothing was fused ({report.reason}): the fused configuration ran as stock ORT")
    matches = report.fused if report.applied else []
    attributions = [attribute(profiles[FUSED], profiles[c], matches) for c in (ENABLE_ALL, DISABLE_ALL)
                    if c in profiles]
    return ProfileResult(label, {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feeds.items()},
                         runs, warmup, profiles, attributions, report.reason, notes)


def _loaded_model(session, original):
    """The rewritten model the fused session handed to ORT: ORT keeps its bytes (``_model_bytes``)
    or its path (``_model_path``); ``original`` when neither is there."""
    import onnx

    data = getattr(session, "_model_bytes", None)
    if data:
        return onnx.load_from_string(data)
    path = getattr(session, "_model_path", None)
    if path and os.path.isfile(path):
        return onnx.load(path, load_external_data=False)  # node names are all that is needed
    return original


def _nodes(totals, counted: int, names: NameMap, matches: list) -> list[NodeTime]:
    """NodeTimes of one profile, hottest first; ``matches`` (fused configuration only) are the
    report's fused MatchRecords, whose rewritten nodes are ``<fused_node>`` or ``<fused_node>/<k>``."""
    by_name = {m.fused_node: m for m in matches}
    out = []
    for name, (op, times, count) in totals.items():
        node = NodeTime(name, op, float(np.median(times)), count / counted)
        node.maps_to, node.how = names.resolve(name, op)
        found = [by_name.get(t) or by_name.get(t.split("/", 1)[0]) for t in node.maps_to]
        owners = list({m.fused_node: m for m in found if m is not None}.values())
        if len(owners) == 1:
            node.fused_op, node.pattern_id, node.replaced = owners[0].fused_node, owners[0].pattern_id, \
                list(owners[0].nodes)
        else:  # a layout op doing several fused ops' work: its time is not split by guesswork
            node.spans = sorted(m.fused_node for m in owners)
        out.append(node)
    return sorted(out, key=lambda n: -n.us)


# --------------------------------------------------------------------------- text and chart


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
    lines += _table(rows)
    lines.append("(run: median model_run; in kernels: median of each run's summed node times; node total: sum of "
                 "the nodes' medians, which the tables below split)")
    lines += ["", "time per op type (ms per run, share of the node total)"]
    cols = [(LABELS[p.config], p.by_op_type()[:top], p.node_us) for p in r.profiles.values()]
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
    lines += [""] + [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


def plot(r: ProfileResult, path: str, top: int = 10) -> None:
    """A PNG: time per op type per configuration, and per pattern fused vs original time."""
    from ortfuse.bench.plot import require_matplotlib

    plt = require_matplotlib()
    att = r.attributions[0] if r.attributions else None
    fig, axes = plt.subplots(1, 2 if att and att.patterns else 1, figsize=(12, 4.5), squeeze=False)
    ax = axes[0][0]
    types: list[str] = []
    for p in r.profiles.values():
        for op, _, _ in p.by_op_type()[:top]:
            if op not in types:
                types.append(op)
    height = 0.8 / max(len(r.profiles), 1)
    for j, p in enumerate(r.profiles.values()):
        times = {op: us for op, us, _ in p.by_op_type()}
        ax.barh([i + j * height for i in range(len(types))], [times.get(t, 0.0) / 1000 for t in types],
                height=height, label=LABELS[p.config], color=f"C{j}")
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(types))])
    ax.set_yticklabels(types, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms per run")
    ax.set_title("time per op type", fontsize=9)
    ax.legend(fontsize=7)
    if att and att.patterns:
        ax = axes[0][1]
        pats = [s for s in att.patterns if s.mapped]
        xs = range(len(pats))
        ax.bar([x - 0.2 for x in xs], [s.fused_mapped_us / 1000 for s in pats], 0.4, label=LABELS[FUSED], color="C0")
        ax.bar([x + 0.2 for x in xs], [s.original_us / 1000 for s in pats], 0.4,
               label=f"original nodes, {LABELS[att.config]}", color="C1")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([s.pattern_id for s in pats], fontsize=7, rotation=20)
        ax.set_ylabel("ms per run")
        ax.set_title("per pattern (mapped fused ops)", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"ortfuse profile {os.path.basename(r.model)}: {r.runs} runs after {r.warmup} warm-up", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    p.add_argument("model", help="path of the .onnx model (or a zoo model name)")
    p.add_argument("--runs", type=int, default=10, help="counted runs per configuration (default 10)")
    p.add_argument("--warmup", type=int, default=1, help="uncounted first runs per configuration (default 1)")
    p.add_argument("--top", type=int, default=10, help="rows per table (default 10)")
    p.add_argument("--patterns", "--pattern", nargs="+", action="extend", dest="patterns", metavar="ID",
                   help="pattern ids to fuse (default: the model's fusion_pattern_id, else all)")
    add_input_arguments(p)
    p.add_argument("--disable-all", action="store_true", help="also profile stock ORT_DISABLE_ALL")
    p.add_argument("--out-dir", metavar="DIR",
                   help="write the raw traces (<config>.json), profile.json and profile.png")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args) -> int:
    from ortfuse import models
    from ortfuse.fusion.catalogue import UnknownPatternError
    from ortfuse.ir import feeds, model_args

    try:
        if args.top < 1:
            raise ProfileError("--top must be at least 1")
        path = models.resolve(args.model)
        model = model_args.load(path)
        made = command_inputs(model, args)
        if args.out_dir and os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
            raise ProfileError(f"--out-dir {args.out_dir!r} exists and is not a directory")
        try:
            result = profile(model, made.feeds, args.runs, args.warmup, default_patterns(model, args.patterns),
                             args.disable_all, args.out_dir, label=path)
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
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_text(result, args.top))
    if args.out_dir and not args.json:
        print(f"wrote {args.out_dir}: " + ", ".join(sorted(os.listdir(args.out_dir))))
    return 0
