"""OpenVINO's CPU plugin beside ORT's profiler (``ortfuse profile --peer openvino``): where its time goes
per executed layer, and which ONNX nodes each layer does.

Two compiled models of the same ONNX bytes, configured as the bench's peer (``bench.peers``: f32
forced, latency mode, one stream, the ORT sessions' thread count), run in the profile's interleaved
rounds:

- ``wall``: counters off; the wall-clock time of each ``infer`` call (``time.perf_counter``) is the
  number to set beside ORT's ``model_run``;
- ``counters``: ``PERF_COUNT`` on; after each counted run ``get_profiling_info()`` gives every
  executed layer's ``node_type``, ``exec_type`` (the kernel, e.g. ``brgconv_avx512_1x1_f32``) and
  ``real_time``. A layer's time is its median over counted runs. The counters measure the layers
  alone: their sum need not equal a run's wall time (the plugin's own work between layers is in
  neither, and the counters themselves cost time), so shares are of the counter total and the wall
  time is reported apart.

Which ONNX nodes a layer does: the runtime model's ``originalLayersNames`` (names of the read model's
ops the layer runs, its fused post-ops included). Before compiling, every op of the read model gets
that rt_info set to its own name, so an op OpenVINO rewrote one for one (a Conv with a BatchNorm
folded into its weights) keeps the ONNX frontend's name. A name resolves through the read model:
its op's output tensors carry the ONNX tensor names, whose producers are the ONNX nodes; an op
without one (an inner op of a decomposed ONNX node) belongs to the ONNX node of its nearest consumer
that has one. A name OpenVINO made when it replaced several ops by one (``HSwish_123`` from
Add+Clip+Mul+Div) resolves to nothing; an ONNX node no layer names, whose every non-constant input
comes from one layer holding such a made name, is counted in that layer ("by position"). ONNX
``Constant`` nodes are left out of every count.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

ORIGINAL_NAMES = "originalLayersNames"
SKIPPED_OPS = {"Constant", "Parameter", "Result"}
# ONNX ops the CPU plugin runs as post-ops of a layer (elementwise, per-channel scale and shift);
# only these are placed by position
POST_OPS = {"Add", "Sub", "Mul", "Div", "Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Exp",
            "BatchNormalization", "LeakyRelu", "PRelu", "Elu", "Erf", "Sqrt", "Pow", "Neg", "Abs", "Max", "Min",
            "Mish", "Softplus", "Gelu", "Selu", "Round", "Floor", "Ceil"}
NORM_LAYERS = {"MVN", "NormalizeL2"}  # OpenVINO's
NORM_OPS = {"ReduceMean", "ReduceSum", "ReduceL2", "Sub", "Pow", "Mul", "Add", "Sqrt", "Div", "Reciprocal"}
COMPUTE_LAYERS = {"Convolution", "GroupConvolution", "Deconvolution", "FullyConnected", "MatMul"}  # OpenVINO's


@dataclass
class LayerTime:
    """One executed layer of OpenVINO's CPU plugin: median ``real_time`` per counted run (us), and the
    ONNX nodes it does (``covers``, in the model's order; ``by_position``: those found by position)."""

    name: str
    layer_type: str  # the profiling info's node_type (OpenVINO's layer type: Convolution, Eltwise, Reorder...)
    exec_type: str  # the kernel (brgconv_avx512_1x1_f32, jit_avx512_f32, ref_any_f32...)
    us: float
    original_names: list[str] = field(default_factory=list)  # its originalLayersNames
    covers: list[str] = field(default_factory=list)
    by_position: list[str] = field(default_factory=list)
    made_names: list[str] = field(default_factory=list)  # names OpenVINO made (not in the read model)


@dataclass
class PeerFusion:
    """Layers of one kind that each do several ONNX nodes: OpenVINO's layer type, the ONNX op types
    it does as one, and how ortfuse runs those nodes (``ortfuse``), with how many layers and their
    summed time."""

    layer_type: str
    onnx_ops: str  # "Conv+BatchNormalization+HardSigmoid+Mul"
    ortfuse: str  # "conv_act(Conv+BatchNormalization) + ORT Mul" or "one conv_act op"
    ortfuse_kernels: int  # how many kernels ortfuse's session runs for them (max over the layers)
    count: int
    us: float
    layers: list[str] = field(default_factory=list)


@dataclass
class OpenVinoProfile:
    """What ``ortfuse profile --peer openvino`` measured of OpenVINO; ``layers`` hottest first."""

    version: str
    precision: str
    threads: int  # the plugin's INFERENCE_NUM_THREADS, read back
    runs: int
    warmup: int
    wall_us: float  # median wall-clock time per run, counters off (comparable to ORT's model_run)
    wall_runs_us: list[float]
    counters_wall_us: float  # median wall-clock time per run of the model with PERF_COUNT on
    layers_run_us: float  # median over counted runs of the run's summed layer times
    layers: list[LayerTime]
    fusions: list[PeerFusion] = field(default_factory=list)
    uncovered: list[str] = field(default_factory=list)  # ONNX nodes (not Constant) no executed layer does
    uncovered_ops: dict[str, int] = field(default_factory=dict)  # their op types, most frequent first
    unresolved: list[str] = field(default_factory=list)  # originalLayersNames found in no read-model op

    @property
    def layer_us(self) -> float:
        return float(sum(n.us for n in self.layers))

    def by_layer_type(self) -> list[tuple[str, float, int]]:
        """(layer type, us per run, layer count), hottest first; the times sum to ``layer_us``."""
        return _grouped(self.layers, lambda n: n.layer_type)

    def by_exec_type(self) -> list[tuple[str, float, int]]:
        """(layer type / kernel, us per run, layer count), hottest first."""
        return _grouped(self.layers, lambda n: f"{n.layer_type} {n.exec_type}")


def _grouped(layers: list[LayerTime], key) -> list[tuple[str, float, int]]:
    acc: dict[str, list] = {}
    for n in layers:
        row = acc.setdefault(key(n), [0.0, 0])
        row[0] += n.us
        row[1] += 1
    return sorted(((k, v[0], v[1]) for k, v in acc.items()), key=lambda r: -r[1])


class OpenVinoPeer:
    """The two compiled models and what their counted runs recorded; ``step(which, counted)`` runs one."""

    WALL, COUNTERS = "openvino_f32", "openvino_counters"

    def __init__(self, model_bytes: bytes, feeds: dict[str, np.ndarray], threads: int = 0) -> None:
        from ortfuse.bench.peers import openvino_config, read_openvino_model

        core, wall_model = read_openvino_model(model_bytes)  # PeerUnavailable without openvino
        import openvino as ov

        self._wall = core.compile_model(wall_model, "CPU", openvino_config(threads)).create_infer_request()
        core, self.read_model = read_openvino_model(model_bytes)
        for op in self.read_model.get_ordered_ops():
            op.get_rt_info()[ORIGINAL_NAMES] = op.get_friendly_name()
        self.compiled = core.compile_model(self.read_model, "CPU", openvino_config(threads, perf_count=True))
        self._counters = self.compiled.create_infer_request()
        self._executed = ov.ProfilingInfo.Status.EXECUTED
        self.version = ov.get_version()
        precision = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        self.precision = precision.to_string() if hasattr(precision, "to_string") else str(precision)
        self.threads = int(self.compiled.get_property("INFERENCE_NUM_THREADS"))
        self.feeds = feeds
        self.wall_runs: list[float] = []
        self.counters_runs: list[float] = []
        self.counted: list[dict[str, tuple[str, str, float]]] = []  # per counted run: name -> (type, kernel, us)

    def step(self, which: str, counted: bool) -> None:
        request = self._wall if which == self.WALL else self._counters
        start = time.perf_counter()
        request.infer(self.feeds)
        us = (time.perf_counter() - start) * 1e6
        if not counted:
            return
        if which == self.WALL:
            self.wall_runs.append(us)
            return
        self.counters_runs.append(us)
        executed = self._executed
        self.counted.append({i.node_name: (i.node_type, i.exec_type, i.real_time.total_seconds() * 1e6)
                             for i in request.get_profiling_info() if i.status == executed})

    def result(self, model, runs: int, warmup: int) -> OpenVinoProfile:
        """The profile, its layers mapped to the nodes of ``model`` (the ONNX model both read)."""
        per_layer: dict[str, tuple[str, str, list[float]]] = {}
        for i, run in enumerate(self.counted):
            for name, (kind, kernel, us) in run.items():
                per_layer.setdefault(name, (kind, kernel, [0.0] * len(self.counted)))[2][i] += us
        originals = {op.get_friendly_name(): str(op.get_rt_info()[ORIGINAL_NAMES].astype(str))
                     for op in self.compiled.get_runtime_model().get_ordered_ops()
                     if ORIGINAL_NAMES in op.get_rt_info()}
        layers = [LayerTime(name, kind, kernel, float(np.median(times)),
                            [o for o in originals.get(name, "").split(",") if o])
                  for name, (kind, kernel, times) in per_layer.items()]
        layers.sort(key=lambda n: -n.us)
        run_sums = [sum(us for _, _, us in run.values()) for run in self.counted] or [0.0]
        out = OpenVinoProfile(self.version, self.precision, self.threads, runs, warmup,
                              float(np.median(self.wall_runs)) if self.wall_runs else 0.0, self.wall_runs,
                              float(np.median(self.counters_runs)) if self.counters_runs else 0.0,
                              float(np.median(run_sums)), layers)
        out.uncovered, out.unresolved = map_layers(layers, self.read_model, model)
        from ortfuse.ir.graph import GraphIndex

        ix = GraphIndex(model, infer_shapes=False)
        kind = {ix.name_of(n): n.op_type for n in model.graph.node}
        out.uncovered_ops = dict(Counter(kind[n] for n in out.uncovered).most_common())
        return out


def map_layers(layers: list[LayerTime], read_model, model) -> tuple[list[str], list[str]]:
    """Fill each layer's ``covers`` / ``by_position`` / ``made_names`` (see the module's contract);
    returns (ONNX nodes no layer does, names found in no read-model op)."""
    from ortfuse.ir.graph import GraphIndex

    ix = GraphIndex(model, infer_shapes=False)
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    name_of = {id(n): ix.name_of(n) for n in model.graph.node}
    producer = {o: name_of[id(n)] for n in nodes for o in n.output if o}
    owners = _read_model_owners(read_model, producer)
    covered: dict[str, int] = {}  # ONNX node -> index of the layer doing it
    unresolved: set[str] = set()
    for k, layer in enumerate(layers):
        for name in layer.original_names:
            if name not in owners:
                layer.made_names.append(name)
                unresolved.add(name)
                continue
            for onnx_name in owners[name]:
                covered.setdefault(onnx_name, k)
    consumers: dict[str, list[str]] = {}
    for node in nodes:
        for i in node.input:
            if i in producer:
                consumers.setdefault(producer[i], []).append(name_of[id(node)])
    kind = {name_of[id(n)]: n.op_type for n in nodes}
    inputs = {name_of[id(n)]: [producer[i] for i in n.input if i in producer] for n in nodes}
    # the head of a compute layer whose named nodes are all post-ops: the one uncovered node that is not
    # a post-op and feeds them (a Conv whose name a weight folding replaced, a MatMul merged with its Add)
    for k, layer in enumerate(layers):
        mine = [n for n, j in covered.items() if j == k]
        if layer.layer_type not in COMPUTE_LAYERS or not mine or any(kind[n] not in POST_OPS for n in mine):
            continue
        heads = {i for n in mine for i in inputs[n] if i not in covered and kind[i] not in POST_OPS}
        if len(heads) == 1:
            head = heads.pop()
            covered[head] = k
            layer.by_position.append(head)
    # a normalization layer (MVN: a LayerNorm's mean, variance and division) named after its last node:
    # the uncovered normalization nodes whose every consumer is in the layer, walked back from it
    for node in reversed(nodes):
        own = name_of[id(node)]
        if own in covered or node.op_type not in NORM_OPS:
            continue
        owners_of = {covered.get(c, -1) for c in consumers.get(own, ())}
        if len(owners_of) == 1 and -1 not in owners_of:
            k = owners_of.pop()
            if layers[k].layer_type in NORM_LAYERS:
                covered[own] = k
                layers[k].by_position.append(own)
    # post-ops merged into a layer: an uncovered post-op whose every non-constant input comes from one
    # layer, when that layer holds a made name (Add+Clip+Mul+Div -> HSwish_123) or the post-op feeds,
    # through such post-ops, a node the layer names (Add, Clip, Mul between a conv and its named Div)
    tentative: dict[str, int] = {}
    for node in nodes:  # the model's order is topological: a chain is followed in one pass
        own = name_of[id(node)]
        if own in covered or node.op_type not in POST_OPS:
            continue
        sources = {covered.get(i, tentative.get(i, -1)) for i in inputs[own]}
        if len(sources) == 1 and -1 not in sources:
            tentative[own] = sources.pop()
    reaches: dict[str, bool] = {}
    for node in reversed(nodes):
        own = name_of[id(node)]
        if own in tentative:
            k = tentative[own]
            reaches[own] = any(covered.get(c) == k or (tentative.get(c) == k and reaches.get(c, False))
                               for c in consumers.get(own, ()))
    for own, k in tentative.items():
        if layers[k].made_names or reaches[own]:
            covered[own] = k
            layers[k].by_position.append(own)
    order = {name_of[id(n)]: k for k, n in enumerate(nodes)}
    for own, k in covered.items():
        layers[k].covers.append(own)
    for layer in layers:
        layer.covers.sort(key=order.__getitem__)
        layer.by_position.sort(key=order.__getitem__)
    return [name_of[id(n)] for n in nodes if name_of[id(n)] not in covered], sorted(unresolved)


def _read_model_owners(read_model, producer: dict[str, str]) -> dict[str, list[str]]:
    """Read-model op name -> the ONNX nodes it comes from (output tensor names, else its nearest
    consumers')."""
    ops = [op for op in read_model.get_ordered_ops() if op.get_type_name() not in SKIPPED_OPS]
    owners: dict[str, list[str]] = {}
    for op in ops:
        found = sorted({producer[t] for out in op.outputs() for t in out.get_names() if t in producer})
        if found:
            owners[op.get_friendly_name()] = found
    for op in reversed(ops):  # consumers come later in the order: walk back
        if op.get_friendly_name() in owners:
            continue
        found = sorted({o for out in op.outputs() for target in out.get_target_inputs()
                        for o in owners.get(target.get_node().get_friendly_name(), ())})
        if found:
            owners[op.get_friendly_name()] = found
    return owners


def compare_fusions(profile: OpenVinoProfile, model, matches: list, ran_alone: set[str]) -> list[PeerFusion]:
    """OpenVINO's layers that do several ONNX nodes, grouped by (layer type, ONNX op types, how ortfuse
    runs them). ``matches``: ortfuse's fused MatchRecords (original nodes -> fused op);
    ``ran_alone``: original nodes ORT ran as a kernel of their own in ortfuse's fused session (a node
    in neither ran inside one of ORT's own fused kernels, or was folded)."""
    from ortfuse.ir.graph import GraphIndex

    ix = GraphIndex(model, infer_shapes=False)
    op_type = {ix.name_of(n): n.op_type for n in model.graph.node}
    owner = {o: m for m in matches for o in m.nodes}
    groups: dict[tuple[str, str, str], PeerFusion] = {}
    for layer in profile.layers:
        if len(layer.covers) < 2:
            continue
        parts: dict[str, list[str]] = {}  # fused op -> its nodes here; "~<node>" for a node left to ORT
        for name in layer.covers:
            parts.setdefault(owner[name].fused_node if name in owner else f"~{name}", []).append(name)
        covers = set(layer.covers)
        kernels, described = 0, []
        for key, names in parts.items():
            ops = "+".join(op_type[n] for n in names)
            if key.startswith("~"):
                kernels += names[0] in ran_alone
                described.append(f"ORT {ops}" + ("" if names[0] in ran_alone else "*"))
                continue
            m = owner[names[0]]
            inside = set(m.nodes) <= covers
            # a fused op reaching into other layers (an affine step folded into the next conv's input)
            # is counted with the layer doing its main op, not here
            kernels += inside or layer.covers[0] in names
            described.append(f"{m.pattern_id}({ops}{'' if inside else '+...'})")
        first = next(iter(parts))
        ortfuse = f"one {owner[parts[first][0]].pattern_id} op" if len(parts) == 1 and not first.startswith("~") \
            else " + ".join(described)
        onnx_ops = "+".join(op_type[n] for n in layer.covers)
        row = groups.setdefault((layer.layer_type, onnx_ops, ortfuse),
                                PeerFusion(layer.layer_type, onnx_ops, ortfuse, 0, 0, 0.0))
        row.ortfuse_kernels = max(row.ortfuse_kernels, kernels, 1)
        row.count += 1
        row.us += layer.us
        row.layers.append(layer.name)
    return sorted(groups.values(), key=lambda g: (-g.us, -g.count))

