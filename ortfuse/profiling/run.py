"""``profile(model, feeds)``: ORT's own profiler on the fused and the unfused model, side by side.

Configurations: ``fused`` (``ortfuse.InferenceSession(fusion=True)``, ORT_ENABLE_ALL behind it),
``ort_enable_all`` (stock ORT, what the user would otherwise run) and, on request,
``ort_disable_all``. Every session has ORT's profiler on (``SessionOptions.enable_profiling``) and
intra-op spinning off (docs/ARCHITECTURE.md §8: a neighbour's spinning threads would inflate the
times); runs are interleaved A B B A, the first ``warmup`` runs of each session are not counted. The
traces are read by ``profiling.trace``, their nodes named by ``profiling.names`` and the savings
attributed by ``profiling.attribution``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field

import numpy as np

from ortfuse.foundation.session_options import make_options
from ortfuse.profiling.attribution import Attribution, attribute
from ortfuse.profiling.names import NameMap
from ortfuse.profiling.openvino_counters import OpenVinoPeer, OpenVinoProfile, compare_fusions
from ortfuse.profiling.trace import NodeTime, Profile, ProfileError, read_trace

CPU = ["CPUExecutionProvider"]
FUSED, ENABLE_ALL, DISABLE_ALL = "fused", "ort_enable_all", "ort_disable_all"
LABELS = {FUSED: "ortfuse fused", ENABLE_ALL: "stock ORT_ENABLE_ALL", DISABLE_ALL: "stock ORT_DISABLE_ALL"}


def _options(level: str, prefix: str | None, threads: int = 0):
    so = make_options(level, threads=threads, spinning=False)
    if prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = prefix
    return so


def _served(so, model, feeds: dict[str, np.ndarray]):
    """``so`` planned at the feeds' sizes (``ortfuse.tune_dims``), as ``ortfuse bench`` plans its
    sessions: the layout step times its native convs at those sizes where the model declares dims
    dynamic, so the profile shows the plan a session serving these inputs runs."""
    from ortfuse.foundation.session_options import DIMS_KEY
    from ortfuse.ir.feeds import FeedError, declared_inputs
    from ortfuse.layout.served_sizes import dims_of

    try:
        named = dims_of(declared_inputs(model), {k: v.shape for k, v in feeds.items()})
    except FeedError:
        return so
    if named:
        so.add_session_config_entry(DIMS_KEY, named)
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
    threads: int = 0  # intra-op threads asked of every session (0: each runtime's default)
    peer: OpenVinoProfile | None = None  # --peer openvino
    environment: dict = field(default_factory=dict)  # bench.environment's, with the load average after

    def to_dict(self) -> dict:
        return asdict(self)


def profile(model, feeds: dict[str, np.ndarray], runs: int = 10, warmup: int = 1, patterns=None,
            disable_all: bool = False, trace_dir: str | None = None, label: str = "", threads: int = 0,
            peer: str | None = None) -> ProfileResult:
    """Profile ``model`` (an ``onnx.ModelProto``) fused and unfused on ``feeds``, with ``threads``
    intra-op threads (0: ORT's default); ``peer="openvino"`` adds OpenVINO's CPU plugin in the same
    rounds (``profiling.openvino_counters``).

    Raw traces are kept in ``trace_dir`` as ``<config>.json`` when it is given."""
    import onnxruntime as ort

    import ortfuse

    if runs < 1 or warmup < 0 or threads < 0:
        raise ProfileError("--runs must be at least 1, --warmup and --threads not negative")
    if peer not in (None, "openvino"):
        raise ProfileError(f"unknown peer {peer!r}; profile knows: openvino")
    from ortfuse.bench.environment import environment, load_average

    env = environment()
    data = model.SerializeToString()
    out_names = [o.name for o in model.graph.output]
    with tempfile.TemporaryDirectory(prefix="ortfuse-profile-") as tmp:
        sessions = {}
        sessions[FUSED] = ortfuse.InferenceSession(
            data, _served(_options("ORT_ENABLE_ALL", os.path.join(tmp, FUSED), threads), model, feeds),
            providers=CPU, fusion=True, fusion_patterns=patterns)
        sessions[ENABLE_ALL] = ort.InferenceSession(
            data, _options("ORT_ENABLE_ALL", os.path.join(tmp, ENABLE_ALL), threads), providers=CPU)
        if disable_all:
            sessions[DISABLE_ALL] = ort.InferenceSession(
                data, _options("ORT_DISABLE_ALL", os.path.join(tmp, DISABLE_ALL), threads), providers=CPU)
        steps = {name: (lambda counted, s=s: s.run(out_names, feeds)) for name, s in sessions.items()}
        ov = _openvino_peer(data, feeds, threads) if peer else None
        if ov is not None:
            steps.update({w: (lambda counted, w=w: ov.step(w, counted)) for w in (ov.WALL, ov.COUNTERS)})
        order = list(steps)
        for i in range(warmup + runs):  # A B B A: each configuration runs first as often as last
            for name in (order if i % 2 == 0 else order[::-1]):
                steps[name](i >= warmup)
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
    peer_profile = None
    if ov is not None:
        peer_profile = ov.result(model, runs, warmup)
        ran_alone = {t for n in profiles[FUSED].nodes if not n.fused_op and not n.spans for t in n.maps_to}
        peer_profile.fusions = compare_fusions(peer_profile, model, matches, ran_alone)
    env["load_average_after"] = load_average()
    return ProfileResult(label, {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feeds.items()},
                         runs, warmup, profiles, attributions, report.reason, notes, threads, peer_profile, env)


def _openvino_peer(data: bytes, feeds: dict[str, np.ndarray], threads: int) -> OpenVinoPeer:
    """The OpenVINO peer, or a ProfileError saying why it cannot run (package missing, model refused)."""
    from ortfuse.bench.peers import PeerUnavailable

    try:
        peer = OpenVinoPeer(data, feeds, threads)
        peer.step(peer.WALL, counted=False)  # the peer refuses these inputs here, not in the rounds
        return peer
    except PeerUnavailable as exc:
        raise ProfileError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - OpenVINO's own errors, one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ProfileError(f"OpenVINO's CPU plugin cannot run this model ({first}); profile it without --peer") \
            from None


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
