"""Inputs for a model's declared graph inputs, as every command and the tuner make them: seeded
sample data a model can take, or arrays a user gives in an ``.npz``; and the check that stock ORT
runs the model on them, with one sentence saying how to fix it when it does not.

Sample data (``random_feeds``). Shapes: a dim named in ``dims`` takes that value; otherwise the first
dim is ``batch`` and any other dynamic dim ``DEFAULT_DIM``. ``sample_shapes`` bounds them for the
tuner and the tuning commands: the dims not given shrink, the batch first, until the inputs fit
``SAMPLE_BUDGET_BYTES``, and it says which sizes it chose and why. Values, seeded:

- floats: standard normal; bools: fair coins;
- integers, given the model: an input whose values index a table is uniform in [0, rows), rows being
  the smallest table it indexes. "Indexes a table": the input, followed forward through ops that
  keep its values (``VALUE_OPS``: Cast to an integer type, Unsqueeze, Squeeze, Reshape, Flatten,
  Identity, Expand, Tile, Transpose, Slice, Concat, Gather's data input) and Add/Sub of an integer
  scalar constant (the range shifts by it), reaches the index input of ``INDEXING_OPS`` (Gather,
  GatherElements, OneHot's depth, com.microsoft EmbedLayerNormalization's and ortfuse's
  FusedEmbedLayerNorm's ids) whose table is an initializer or Constant (seen through
  Identity/Cast/DequantizeLinear) with a known size on the indexed axis;
- other integers: [0, 2) when the input is a mask, that is, its name contains "mask" or its values
  reach (through ``VALUE_OPS``) a Cast to a floating type (an attention mask turned into a bias),
  else [0, 8), small enough to be valid indices of most embeddings.

``load_npz`` reads given arrays by input name and checks them against the declared inputs (missing
name, dtype, rank, fixed dims). ``command_feeds`` is what the commands call: one of the two, with the
notes a command prints. ``check_feeds`` runs stock ORT once and raises ``SampleRejected`` with the
sentence to print.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

DEFAULT_DIM = 128
SAMPLE_BUDGET_BYTES = 64 * 2**20
"""Bytes of sample inputs (all inputs together) that ``sample_shapes`` lets the dims it chooses
take: the tuner (``fusion="auto"``), ``ortfuse tune`` and ``ortfuse-annotate --tune`` make their
sample data within it. Why 64 MiB: the default shapes of common models take far less (a float32
image batch 1x3x1024x1024 is 12 MiB, 512 token ids 4 KiB), so it changes nothing for them, while a
model with four dynamic dims at ``DEFAULT_DIM`` would take 128**4 floats = 1 GiB for one input (and
ORT's activations on it a multiple of that) where stock ORT creates the session allocating nothing.
A memory bound chosen, not a speed measured: dims the model fixes or the user gives are never shrunk."""
INT_RANGE = (0, 8)
MASK_RANGE = (0, 2)
FIX = "pass real inputs with --inputs data.npz or set dynamic dims with --dim NAME=N"

# ops whose output holds (some of) the values of the input at these positions ("*": any input)
VALUE_OPS: dict[str, tuple[int, ...] | str] = {
    "Cast": (0,), "Unsqueeze": (0,), "Squeeze": (0,), "Reshape": (0,), "Flatten": (0,), "Identity": (0,),
    "Expand": (0,), "Tile": (0,), "Transpose": (0,), "Slice": (0,), "Concat": "*", "Gather": (0,),
}
# op -> (index input, table input, axis attribute or fixed axis); OneHot: values < depth (a scalar input)
INDEXING_OPS: dict[str, tuple[tuple[int, int, str | int], ...]] = {
    "Gather": ((1, 0, "axis"),),
    "GatherElements": ((1, 0, "axis"),),
    "EmbedLayerNormalization": ((0, 2, 0), (1, 4, 0), (9, 3, 0)),
    "FusedEmbedLayerNorm": ((0, 2, 0), (1, 3, 0)),  # ortfuse's op, in a model saved fused
}
_TABLE_THROUGH = {"Identity", "Cast", "DequantizeLinear"}  # ops a table is seen through, backwards
_FLOAT_TYPES = {1, 10, 11, 16}  # onnx FLOAT, FLOAT16, DOUBLE, BFLOAT16


class FeedError(ValueError):
    """No inputs can be made or read for the model; the message is one sentence saying which and why."""


class SampleRejected(FeedError):
    """Stock ORT raised on the inputs; the message is the sentence a command prints, with the fix."""


Declared = tuple[str, int, list]  # (name, onnx elem type, dims: int or dim_param str or None)


def _model(model: onnx.ModelProto | str) -> onnx.ModelProto:
    import onnx

    return onnx.load(model, load_external_data=False) if isinstance(model, str) else model


def declared_inputs(model: onnx.ModelProto | str) -> list[Declared]:
    """(name, onnx elem type, dims) of the graph inputs that are not initializers."""
    model = _model(model)
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if not vi.type.HasField("tensor_type"):
            raise FeedError(f"input {vi.name!r} is not a tensor; only tensor inputs can be fed sample data")
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            raise FeedError(f"input {vi.name!r} has no declared shape; pass inputs explicitly")
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
                for d in tt.shape.dim]
        out.append((vi.name, tt.elem_type, dims))
    return out


BATCH = ("batch",)  # the free dim every input's first dynamic dim is (``_entry``)


def _entry(name: str, axis: int, dim, named: Mapping[str, int]) -> int | tuple:
    """A declared dim as sample data takes it: its size when fixed or named in ``named``, else the
    free dim it is: ``BATCH`` for a first dim, ``(dim_param,)`` (shared by the inputs naming it) or
    ``(input, axis)`` when unnamed."""
    if isinstance(dim, int):
        return dim
    if dim in named:
        return int(named[dim])
    if axis == 0:
        return BATCH
    return ("dim", dim) if dim else ("axis", name, axis)


def with_named_dims(model: onnx.ModelProto, named: Mapping[str, int]) -> onnx.ModelProto | None:
    """A copy of ``model`` whose declared inputs have the dynamic dims ``named`` gives fixed (by dim
    name; ``batch``: every input's first dynamic dim, as ``sample_shapes`` reads it), or None when
    ``named`` fixes none of them. The other dims stay as declared."""
    import onnx

    fixed: dict[str, dict[int, int]] = {}
    for name, _, dims in declared_inputs(model):
        for axis, dim in enumerate(dims):
            entry = _entry(name, axis, dim, named)
            size = int(named["batch"]) if entry == BATCH and "batch" in named else entry
            if not isinstance(dim, int) and isinstance(size, int):
                fixed.setdefault(name, {})[axis] = size
    if not fixed:
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for vi in copy.graph.input:
        for axis, size in fixed.get(vi.name, {}).items():
            dim = vi.type.tensor_type.shape.dim[axis]
            dim.Clear()
            dim.dim_value = size
    return copy


def _label(free: tuple) -> str:
    return "batch" if free == BATCH else str(free[1]) if free[0] == "dim" else f"{free[1]}[{free[2]}]"


def concrete_shape(dims: list, batch: int = 1, named: Mapping[str, int] | None = None) -> list[int]:
    """The shape a declared input is fed at (see the module docstring for dynamic dims)."""
    entries = (_entry("", i, d, named or {}) for i, d in enumerate(dims))
    return [e if isinstance(e, int) else batch if e == BATCH else DEFAULT_DIM for e in entries]


@dataclass
class SampleShapes:
    """The shapes sample inputs are made at (``sample_shapes``), by input name; the size chosen for
    each dynamic dim not given (by label: ``batch``, the dim's name, ``input[axis]`` when unnamed);
    the inputs' total bytes; and one sentence when the budget changed the sizes or the dims the
    model fixes or the user gave exceed it (else "")."""

    shapes: dict[str, list[int]]
    chosen: dict[str, int]
    nbytes: int
    note: str = ""


def _itemsize(elem: int) -> int:
    import onnx

    try:
        return int(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).itemsize)
    except (KeyError, TypeError, ValueError):  # no numpy dtype: random_feeds refuses it with the reason
        return 1


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.3g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.3g} MiB"


def _largest(fits, low: int, high: int) -> int:
    """The largest x in [low, high] with ``fits(x)`` (``fits`` true up to some x, false beyond), else low."""
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def sample_shapes(declared: list[Declared], batch: int = 1, named: Mapping[str, int] | None = None,
                  budget: int | None = SAMPLE_BUDGET_BYTES) -> SampleShapes:
    """The shapes of sample inputs for ``declared`` within ``budget`` bytes in total (None: no cap).

    Dims the model fixes and dims in ``named`` (``--dim``, ``ortfuse.tune_dims``; ``batch`` there
    pins every first dynamic dim) are kept. The others start at ``batch`` (first dims) and
    ``DEFAULT_DIM``; when the inputs would exceed ``budget``, the batch shrinks first (to the largest
    size that fits, at least 1), then the other dynamic dims evenly: all capped at the largest common
    size that fits. When even size 1 does not fit, the dims kept exceed the budget: the inputs are
    made at them (the model cannot run on less) and the note says so."""
    named = dict(named or {})
    layout = {name: (_itemsize(elem), [_entry(name, i, d, named) for i, d in enumerate(dims)])
              for name, elem, dims in declared}
    params = {d for _, _, dims in declared for d in dims if isinstance(d, str)}
    uses_batch = any(e == BATCH for _, entries in layout.values() for e in entries)
    given = {k: int(v) for k, v in named.items() if k in params or (k == "batch" and uses_batch)}
    if "batch" in named:
        layout = {k: (item, [int(named["batch"]) if e == BATCH else e for e in entries])
                  for k, (item, entries) in layout.items()}
    free = list(dict.fromkeys(e for _, entries in layout.values() for e in entries if not isinstance(e, int)))
    start = {f: int(batch) if f == BATCH else DEFAULT_DIM for f in free}

    def shapes(sizes: Mapping[tuple, int]) -> dict[str, list[int]]:
        return {k: [e if isinstance(e, int) else sizes[e] for e in entries] for k, (_, entries) in layout.items()}

    def total(sizes: Mapping[tuple, int]) -> int:
        return sum(int(np.prod(shape, dtype=np.int64)) * layout[k][0] for k, shape in shapes(sizes).items())

    sizes = dict(start)
    wanted = total(sizes)
    if budget is None or wanted <= budget:
        return SampleShapes(shapes(sizes), {_label(f): v for f, v in sizes.items()}, wanted)
    if BATCH in sizes:
        sizes[BATCH] = _largest(lambda b: total({**sizes, BATCH: b}) <= budget, 1, sizes[BATCH])
    others = [f for f in free if f != BATCH]
    if others and total(sizes) > budget:
        def capped(cap: int) -> dict[tuple, int]:
            return {**sizes, **{f: min(start[f], cap) for f in others}}

        sizes = capped(_largest(lambda cap: total(capped(cap)) <= budget, 1, max(start[f] for f in others)))
    made = total(sizes)
    chosen = {_label(f): v for f, v in sizes.items()}
    picked = ", ".join(f"{k}={v}" for k, v in chosen.items())
    if made <= budget:
        defaults = (f"batch {batch} and {DEFAULT_DIM} per other dynamic dim" if BATCH in start else
                    f"{DEFAULT_DIM} per dynamic dim")
        note = (f"sample inputs shrunk to fit the {_size(budget)} budget of sample inputs: {picked} (at the "
                f"default sizes, {defaults}, they would take {_size(wanted)}; the batch shrinks first, then the "
                "other dynamic dims evenly; set sizes with --dim NAME=N or the ortfuse.tune_dims entry)")
    elif given:
        note = (f"the dims you gave ({', '.join(f'{k}={v}' for k, v in given.items())}) make sample inputs of "
                f"{_size(made)}, over the {_size(budget)} budget of sample inputs; they are kept as given"
                + (f" and the other dynamic dims set to {picked}" if chosen else ""))
    else:
        note = (f"the dims the model fixes make sample inputs of {_size(made)}, over the {_size(budget)} budget of "
                "sample inputs; they are made at those dims, the least the model runs on"
                + (f", with its dynamic dims at {picked}" if chosen else ""))
    return SampleShapes(shapes(sizes), chosen, made, note)


# --------------------------------------------------------------------------- value ranges from the graph


class _Values:
    """The graph's links (``GraphLinks``: producers, and ``uses`` with each input position) and its
    constant tensors kept as TensorProtos (a table's rows are read from its dims, never by decoding it)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        from ortfuse.ir.links import GraphLinks

        self.links = GraphLinks(model.graph)
        self.constants: dict[str, onnx.TensorProto] = dict(self.links.initializers)
        for node in model.graph.node:
            if node.op_type == "Constant" and node.output:
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    self.constants[node.output[0]] = value

    def table_rows(self, name: str, axis: int) -> int | None:
        """Size on ``axis`` of the constant ``name`` (seen through ``_TABLE_THROUGH``), None if unknown."""
        for _ in range(8):
            if name in self.constants:
                dims = list(self.constants[name].dims)
                if -len(dims) <= axis < len(dims) and dims[axis] > 0:
                    return int(dims[axis])
                return None
            node = self.links.parent(name, _TABLE_THROUGH, domain=None)
            if node is None or not node.input:
                return None
            name = node.input[0]
        return None

    def scalar(self, name: str) -> int | None:
        """The value of an integer scalar (or one-element) constant, None otherwise."""
        from onnx import numpy_helper

        t = self.constants.get(name)
        if t is None:
            return None
        try:
            a = numpy_helper.to_array(t)
        except Exception:  # noqa: BLE001 - external or malformed data: not a known constant
            return None
        return int(a.reshape(-1)[0]) if a.size == 1 and a.dtype.kind in "iu" else None


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def _cast_to(node: onnx.NodeProto) -> int:
    return _attr(node, "to", 0)


def _follow(graph: _Values, start: str) -> tuple[tuple[int, int] | None, bool]:
    """([low, high) the values of ``start`` must lie in to index every table they reach, or None when
    they index none; whether they reach a Cast to a floating type)."""
    low, high, found, to_float = 0, None, False, False
    stack, seen = [(start, 0)], set()
    while stack:
        name, shift = stack.pop()  # values of ``name`` = input values + shift
        if (name, shift) in seen:
            continue
        seen.add((name, shift))
        for node, idx in graph.links.uses(name):
            op = node.op_type
            for index_input, table_input, axis in INDEXING_OPS.get(op, ()):
                if idx != index_input or len(node.input) <= table_input:
                    continue
                rows = graph.table_rows(node.input[table_input],
                                        _attr(node, axis, 0) if isinstance(axis, str) else axis)
                if rows is not None:
                    found = True
                    low, high = max(low, -shift), rows - shift if high is None else min(high, rows - shift)
            if op == "OneHot" and idx == 0 and len(node.input) > 1:
                depth = graph.scalar(node.input[1])
                if depth is not None and depth > 0:
                    found = True
                    low, high = max(low, -shift), depth - shift if high is None else min(high, depth - shift)
            if op == "Cast" and _cast_to(node) in _FLOAT_TYPES:
                to_float = True
                continue
            positions = VALUE_OPS.get(op)
            if positions is not None and (positions == "*" or idx in positions):
                stack += [(out, shift) for out in node.output[:1] if out]
            elif op in ("Add", "Sub") and len(node.input) == 2:
                k = graph.scalar(node.input[1 - idx])
                if k is not None and (op == "Add" or idx == 0):
                    stack.append((node.output[0], shift + (k if op == "Add" else -k)))
    if not found or high is None or high <= low:
        return None, to_float
    return (low, high), to_float


def integer_ranges(model: onnx.ModelProto | str, declared: list[Declared] | None = None) -> dict[str, tuple]:
    """{integer input: (low, high, why)}: the half-open range ``random_feeds`` draws it from, and the
    rule that chose it (see the module docstring)."""
    import onnx

    model = _model(model)
    declared = declared_inputs(model) if declared is None else declared
    graph = _Values(model)
    out = {}
    for name, elem, _ in declared:
        if np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).kind not in "iu":
            continue
        table, to_float = _follow(graph, name)
        if table is not None:
            out[name] = (*table, "indexes a table")
        elif "mask" in name.lower() or to_float:
            out[name] = (*MASK_RANGE, "mask")
        else:
            out[name] = (*INT_RANGE, "default")
    return out


def random_feeds(declared: list[Declared], batch: int = 1, dims: Mapping[str, int] | None = None,
                 seed: int = 0, model: onnx.ModelProto | str | None = None,
                 shapes: Mapping[str, list[int]] | None = None) -> dict[str, np.ndarray]:
    """Seeded sample arrays for ``declared`` inputs, at ``shapes`` (``sample_shapes``'s) when given,
    else at ``concrete_shape``'s; with ``model``, integer inputs are drawn in the ranges
    ``integer_ranges`` reads from its graph, else in [0, 8) (see the module docstring)."""
    import onnx

    ranges = integer_ranges(model, declared) if model is not None else {}
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, elem, decl in declared:
        shape = list(shapes[name]) if shapes is not None else concrete_shape(decl, batch, dims)
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
        if dtype.kind in "fc":
            drawn = rng.standard_normal(shape, dtype=dtype) if dtype in (np.float32, np.float64) \
                else rng.standard_normal(shape)
            feeds[name] = drawn.astype(dtype, copy=False)
        elif dtype.kind in "iu":
            low, high = ranges.get(name, INT_RANGE)[:2]
            feeds[name] = rng.integers(low, high, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[name] = rng.random(shape) < 0.5
        else:
            raise FeedError(f"input {name!r} has dtype {dtype}, for which no sample data can be made; "
                            "pass inputs explicitly")
    return feeds


# --------------------------------------------------------------------------- given arrays, and the check


def _expected(elem: int, dims: list) -> str:
    import onnx

    shape = ", ".join(str(d) if d is not None else "?" for d in dims)
    return f"{np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))} [{shape}]"


def load_npz(path: str, declared: list[Declared]) -> tuple[dict[str, np.ndarray], list[str]]:
    """(arrays of ``path`` by declared input name, notes): a ``FeedError`` names the first input that is
    missing or has another dtype, rank or fixed dim than declared; arrays no input takes are noted."""
    import onnx

    try:
        with np.load(path, allow_pickle=False) as archive:
            data = {k: archive[k] for k in archive.files}
    except Exception as exc:  # noqa: BLE001 - missing file, not a zip, pickled arrays refused...
        raise FeedError(f"cannot read {path!r} as a .npz archive ({type(exc).__name__})") from None
    missing = [(n, e, d) for n, e, d in declared if n not in data]
    if missing:
        raise FeedError(f"{path} has no array for model input(s) {', '.join(n for n, _, _ in missing)} "
                        f"(expected {'; '.join(f'{n}: {_expected(e, d)}' for n, e, d in missing)}; "
                        f"it has {', '.join(data) or 'none'})")
    for name, elem, dims in declared:
        a, want = data[name], np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
        fixed_ok = all(not isinstance(d, int) or d == s for d, s in zip(dims, a.shape))
        if a.dtype != want or a.ndim != len(dims) or not fixed_ok:
            raise FeedError(f"{path}: input {name!r} is {a.dtype} {list(a.shape)}, the model expects "
                            f"{_expected(elem, dims)}")
    names = [d[0] for d in declared]
    extra = [k for k in data if k not in names]
    notes = [f"{path}: array(s) {', '.join(extra)} are not model inputs and were ignored"] if extra else []
    return {n: data[n] for n in names}, notes


@dataclass
class CommandFeeds:
    """Inputs a command runs on: the arrays, where they come from (``npz`` path or None for sample
    data), a one-line description of that, and notes for the user."""

    feeds: dict[str, np.ndarray]
    npz: str | None
    source: str
    notes: list[str] = field(default_factory=list)


def command_feeds(model: onnx.ModelProto | str, npz: str | None = None, dims: Mapping[str, int] | None = None,
                  batch: int = 1, seed: int = 0, budget: int | None = None) -> CommandFeeds:
    """Arrays from ``npz`` (``--inputs``), else sample data (``--dim`` values in ``dims``; ``batch``
    unless ``dims`` names it) drawn by the model's rules, the dims not given shrunk to ``budget``
    bytes when one is given (``sample_shapes``, its sentence among the notes); ``FeedError`` with
    one sentence otherwise."""
    model = _model(model)
    dims = dict(dims or {})
    declared = declared_inputs(model)
    if npz is not None:
        feeds, notes = load_npz(npz, declared)
        if dims:
            notes.append("--dim is ignored with --inputs: the arrays' shapes are used")
        return CommandFeeds(feeds, npz, npz, notes)
    params = {d for _, _, decl in declared for d in decl if isinstance(d, str)}
    unknown = sorted(set(dims) - params - {"batch"})
    notes = [f"--dim {', '.join(unknown)}: no model input has a dim of that name"] if unknown else []
    planned = sample_shapes(declared, dims.get("batch", batch), dims, budget) if budget is not None else None
    try:
        feeds = random_feeds(declared, batch=dims.get("batch", batch), dims=dims, seed=seed, model=model,
                             shapes=planned.shapes if planned is not None else None)
    except FeedError as exc:
        raise FeedError(f"{exc} (with --inputs data.npz)") from None
    if planned is not None and planned.note:
        notes.append(planned.note)
        chosen = ", ".join(f"{k}={v}" for k, v in planned.chosen.items())
        source = (f"random, seed {seed}; dynamic dims not set with --dim: {chosen}" if chosen else
                  f"random, seed {seed}; every dim fixed or set with --dim")
    else:
        source = f"random, seed {seed}; dynamic dims: first {dims.get('batch', batch)}, others {DEFAULT_DIM}, " \
                 "unless set with --dim"
    return CommandFeeds(feeds, None, source, notes)


def ort_message(exc: BaseException) -> str:
    """ORT's error on one line, without its ``[ONNXRuntimeError] : N : CODE :`` prefix and C++ source
    location: ``Reshape node 'name': <ORT's message>``."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = re.sub(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*", "", text)
    text = re.sub(r"^Non-zero status code returned while running (\w+) node\. Name:'([^']*)' Status Message: ",
                  lambda m: f"{m.group(1)} node{f' {m.group(2)!r}' if m.group(2) else ''}: ", text)
    text = re.sub(r"\S+\.(?:h|cc|cpp|cu):\d+ [\w:~<>]+\([^)]*\)\s*", "", text)
    return text[:400].rstrip(". ")


def rejected(exc: BaseException, npz: str | None = None) -> str:
    """The sentence for inputs stock ORT raised on: sample data (None) or the arrays of ``npz``."""
    if npz is None:
        return f"the model rejected the sample inputs (ORT: {ort_message(exc)}); {FIX}"
    return (f"the model rejected the inputs in {npz} (ORT: {ort_message(exc)}); check them against the "
            "model's declared inputs")


def check_feeds(model: onnx.ModelProto | str, feeds: Mapping[str, np.ndarray], npz: str | None = None) -> None:
    """Run stock ORT (CPU, ORT_DISABLE_ALL) once on ``feeds``: ``SampleRejected`` (the sentence of
    ``rejected``) when the run raises; ``FeedError`` when ORT cannot even load the model."""
    import onnxruntime as ort

    from ortfuse.foundation.session_options import make_options

    so = make_options("ORT_DISABLE_ALL")
    so.log_severity_level = 4  # ORT would log the error it raises; the caller prints one sentence instead
    try:
        data = model if isinstance(model, str) else model.SerializeToString()
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT's load errors have several types
        raise FeedError(f"stock onnxruntime cannot load the model (ORT: {ort_message(exc)})") from None
    try:
        sess.run(None, dict(feeds))
    except Exception as exc:  # noqa: BLE001 - ORT's run errors have several types
        raise SampleRejected(rejected(exc, npz)) from None
