"""``ortfuse verify MODEL``: the fused model against stock ORT on the same inputs, and, on a
mismatch, which fused op is wrong (found by bisection over the fused ops).

Contract:
- Reference: stock ``onnxruntime`` on the CPU at ``ORT_DISABLE_ALL``. Candidate: the model rewritten
  by ``fuse(model, patterns)`` (the rewrite ``fusion=True`` performs) and run by
  ``ortfuse.InferenceSession`` as a saved-fused model (ORT_ENABLE_ALL behind it).
- An output is within tolerance when it has the reference's shape and dtype and every element has
  ``|fused - ref| <= atol + rtol * |ref|``; NaN must sit where the reference has NaN, an infinity
  where the reference has the same infinity (numpy.isclose's rule with equal_nan).
- On a mismatch the fused ops are bisected: with nothing fused (stock ORT_ENABLE_ALL, the baseline)
  the outputs must match, else ORT itself is to blame and nothing is attributed; then a failing
  group is split in two halves, each fused alone (``fuse(..., keep=...)``) and run; failing halves
  are split again down to single ops (the culprits). A group that fails while both its halves pass
  is reported as an interaction. Finally everything except culprits and interaction groups is fused
  and run to confirm. One culprit among n ops costs at most 2*ceil(log2 n) + 2 runs (baseline,
  two per level, confirmation); every ORT run is counted.
- ``transform(fused_model) -> fused_model`` is applied to every fused model before it runs: a hook
  for tests (injecting a faulty kernel) and experiments.
- CLI exit status: 0 within tolerance, 1 mismatch, 2 usage error, unreadable model, or inputs the
  model rejects (``ortfuse.ir.feeds.check_feeds``: one sentence with the fix).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ortfuse.cli.common import add_input_arguments, command_inputs, default_patterns
from ortfuse.foundation.session_options import make_options

if TYPE_CHECKING:  # onnx is imported where a model is parsed
    import onnx

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-4
DEFAULT_SEED = 0
CPU = ["CPUExecutionProvider"]
LEFT_OUT = "left out by ortfuse verify's bisection"

Transform = Callable[["onnx.ModelProto"], "onnx.ModelProto"]


class VerifyError(Exception):
    """A usage problem (unreadable model, bad inputs, unknown pattern); the CLI exits with 2."""


# --------------------------------------------------------------------------- comparison


@dataclass
class OutputDiff:
    """How one fused output compares with the reference. ``max_rel`` is over elements whose
    reference is nonzero; ``worst_index`` is the element with the largest excess of
    |fused - ref| over its tolerance (None for empty outputs)."""

    name: str
    ok: bool
    shape: list[int]
    dtype: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    worst_index: list[int] | None = None
    fused_value: float | None = None
    reference_value: float | None = None
    problem: str = ""


def compare_output(name: str, got, ref, atol: float, rtol: float) -> OutputDiff:
    """Compare one fused output ``got`` with the reference ``ref`` (see the module contract)."""
    got, ref = np.asarray(got), np.asarray(ref)
    diff = OutputDiff(name, True, list(ref.shape), str(ref.dtype))
    if got.shape != ref.shape or got.dtype != ref.dtype:
        diff.ok = False
        diff.problem = f"fused gives {got.dtype}{list(got.shape)}, the reference {ref.dtype}{list(ref.shape)}"
        diff.max_abs = diff.max_rel = math.inf
        return diff
    if ref.size == 0:
        return diff
    if ref.dtype.kind not in "biufc":
        equal = got == ref
        diff.ok = bool(equal.all())
        if not diff.ok:
            diff.problem = "non-numeric values differ"
            idx = np.unravel_index(int(np.argmin(equal)), ref.shape)
            diff.worst_index = [int(i) for i in idx]
        return diff
    g, r = got.astype(np.float64), ref.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        same = (g == r) | (np.isnan(g) & np.isnan(r))  # equal infinities and NaN pairs
        err = np.where(same, 0.0, np.abs(g - r))
        err[np.isnan(err)] = math.inf  # NaN on one side only, or inf against a finite value
        bound = atol + rtol * np.where(np.isfinite(r), np.abs(r), 0.0)
        excess = err - bound
        nonzero = r != 0
        rel = np.where(nonzero & np.isfinite(r), err / np.where(nonzero, np.abs(r), 1.0), 0.0)
    worst = int(np.argmax(excess))
    idx = np.unravel_index(worst, ref.shape)
    diff.ok = bool((excess <= 0).all())
    diff.max_abs = float(err.max())
    diff.max_rel = float(rel.max())
    diff.worst_index = [int(i) for i in idx]
    diff.fused_value = float(g.flat[worst])
    diff.reference_value = float(r.flat[worst])
    return diff


def compare_outputs(names: list[str], got: list, ref: list, atol: float, rtol: float) -> list[OutputDiff]:
    return [compare_output(n, g, r, atol, rtol) for n, g, r in zip(names, got, ref)]


# --------------------------------------------------------------------------- running


@dataclass(frozen=True)
class FusedOp:
    """One fused op of the full rewrite: its pattern, the original nodes it replaces, its node name."""

    pattern_id: str
    nodes: tuple[str, ...]
    fused_node: str = ""

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        return self.pattern_id, self.nodes


@dataclass
class Trial:
    """One ORT run of a fused subset: whether it matched the reference, and the error if it raised."""

    ok: bool
    outputs: list[OutputDiff] = field(default_factory=list)
    error: str = ""


class Runner:
    """Runs the reference and fused subsets of one model on fixed feeds, counting every ORT run."""

    def __init__(self, model, feeds: Mapping[str, np.ndarray], patterns, atol: float, rtol: float,
                 transform: Transform | None = None, kernels: str | None = None) -> None:
        self.model = model
        self.feeds = dict(feeds)
        self.patterns = patterns
        self.atol, self.rtol = atol, rtol
        self.transform = transform
        self.kernels = kernels
        self.runs = 0
        self.output_names = [o.name for o in model.graph.output]
        self.reference = self._run_stock(_level("ORT_DISABLE_ALL"))

    def _run_stock(self, level) -> list:
        import onnxruntime as ort

        sess = ort.InferenceSession(self.model.SerializeToString(), make_options(level), providers=CPU)
        self.runs += 1
        return sess.run(self.output_names, self.feeds)

    def fuse(self, subset: set | None):
        """The model fused with every legal match (``subset=None``) or only the matches in ``subset``."""
        from ortfuse.fusion.rewrite import fuse

        keep = None if subset is None else (lambda rec: "" if (rec.pattern_id, tuple(rec.nodes)) in subset
                                            else LEFT_OUT)
        return fuse(self.model, self.patterns, self.kernels, keep=keep)

    def trial(self, subset: set | None) -> tuple[Trial, Any]:
        """Fuse ``subset`` (None: everything), transform, run once, compare. Returns (trial, report)."""
        import onnxruntime as ort

        import ortfuse
        from ortfuse.fusion.provenance import is_rewritten

        fused, report = self.fuse(subset)
        if self.transform is not None:
            fused = self.transform(fused)
        # the ORT transformers fusion=True disables for this rewrite, disabled here alike
        extra = {"disabled_optimizers": set(report.disabled_ort_optimizers)} if report.disabled_ort_optimizers else {}
        self.runs += 1  # counted when tried: a session that cannot even be created is a failed run
        try:
            if is_rewritten(fused):  # a saved-fused model: ortfuse runs it as is, with its ops registered
                sess = ortfuse.InferenceSession(fused.SerializeToString(), providers=CPU, **extra)
            else:  # nothing fused: what stock ORT runs by default
                sess = ort.InferenceSession(fused.SerializeToString(), providers=CPU, **extra)
            got = sess.run(self.output_names, self.feeds)
        except Exception as exc:  # noqa: BLE001 - a fused op that raises is as wrong as one that miscomputes
            return Trial(False, error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"), report
        diffs = compare_outputs(self.output_names, got, self.reference, self.atol, self.rtol)
        return Trial(all(d.ok for d in diffs), diffs), report


def _level(name: str):
    import onnxruntime as ort

    return getattr(ort.GraphOptimizationLevel, name)


# --------------------------------------------------------------------------- bisection


@dataclass
class Bisection:
    """The result of bisecting the fused ops. ``baseline_ok`` False means stock ORT_ENABLE_ALL alone
    already differs from the reference, so nothing was attributed. ``confirmed`` says whether the
    model with every fused op except the culprits and interaction groups is within tolerance
    (None when that run was not needed)."""

    candidates: int
    runs: int = 0
    baseline_ok: bool = True
    culprits: list[FusedOp] = field(default_factory=list)
    interactions: list[list[FusedOp]] = field(default_factory=list)
    confirmed: bool | None = None
    errors: dict[str, str] = field(default_factory=dict)  # fused node -> error of its single-op run


def bisect(runner: Runner, ops: list[FusedOp]) -> Bisection:
    """Find the fused ops in ``ops`` (which fail together) responsible for the mismatch."""
    start = runner.runs
    result = Bisection(len(ops))
    baseline, _ = runner.trial(set())
    result.baseline_ok = baseline.ok
    if not baseline.ok:
        result.runs = runner.runs - start
        return result

    def fails(group: list[FusedOp]) -> bool:
        trial, _ = runner.trial({op.key for op in group})
        if trial.error and len(group) == 1:
            result.errors[group[0].fused_node] = trial.error
        return not trial.ok

    def search(group: list[FusedOp]) -> None:  # ``group`` is known to fail
        if len(group) == 1:
            result.culprits.append(group[0])
            return
        half = len(group) // 2
        left, right = group[:half], group[half:]
        left_fails, right_fails = fails(left), fails(right)
        if left_fails:
            search(left)
        if right_fails:
            search(right)
        if not left_fails and not right_fails:
            result.interactions.append(group)

    if ops:
        search(ops)
        blamed = {op.key for op in result.culprits} | {op.key for g in result.interactions for op in g}
        rest = [op for op in ops if op.key not in blamed]
        if rest:
            result.confirmed = not fails(rest)
        else:
            result.confirmed = True  # nothing left fused: that is the baseline, which passed
    result.runs = runner.runs - start
    return result


def run_bound(n: int) -> int:
    """Most ORT runs ``bisect`` needs to find one culprit among ``n`` fused ops."""
    return 2 * math.ceil(math.log2(n)) + 2 if n > 1 else 2


# --------------------------------------------------------------------------- verify


@dataclass
class VerifyResult:
    """Everything ``verify`` found; ``to_dict`` is the ``--json`` schema."""

    model: str
    ok: bool
    atol: float
    rtol: float
    patterns: list[str]
    inputs: dict[str, dict]
    input_source: str
    fused_ops: list[FusedOp]
    outputs: list[OutputDiff]
    error: str = ""
    bisection: Bisection | None = None
    ort_runs: int = 0
    suggestion: dict | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["exit_status"] = 0 if self.ok else 1
        return _json_safe(d)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def _json_safe(value):
    """inf/NaN become strings, tuples lists: the JSON is strict (no Infinity tokens)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def verify(model, feeds: Mapping[str, np.ndarray], patterns=None, atol: float = DEFAULT_ATOL,
           rtol: float = DEFAULT_RTOL, *, transform: Transform | None = None, kernels: str | None = None,
           bisect_on_mismatch: bool = True, label: str = "", input_source: str = "given") -> VerifyResult:
    """Run ``model`` (an ``onnx.ModelProto``) fused and unfused on ``feeds``; bisect on a mismatch.

    ``patterns``: ids to fuse (None: all). Raises ``VerifyError`` for a model saved already fused
    (stock ORT cannot run it as the reference) and ``UnknownPatternError`` for unknown ids."""
    from ortfuse.fusion.catalogue import validate_patterns
    from ortfuse.fusion.provenance import is_rewritten

    ids = list(validate_patterns(patterns))
    if is_rewritten(model):
        raise VerifyError(f"{label or 'the model'} is saved already fused, so stock ORT cannot run it as "
                          "the reference; verify the original model")
    try:
        runner = Runner(model, feeds, ids, atol, rtol, transform, kernels)
    except VerifyError:
        raise
    except Exception as exc:  # noqa: BLE001 - ORT's errors for models it refuses have several types
        raise VerifyError(f"stock onnxruntime cannot run {label or 'the model'} on these inputs "
                          f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]})") from None
    full, report = runner.trial(None)
    ops = [FusedOp(m.pattern_id, tuple(m.nodes), m.fused_node) for m in report.fused]
    result = VerifyResult(
        model=label, ok=full.ok, atol=atol, rtol=rtol, patterns=ids,
        inputs={k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in runner.feeds.items()},
        input_source=input_source, fused_ops=ops, outputs=full.outputs, error=full.error,
        notes=list(report.notes))
    if not report.applied:
        result.notes.append(f"nothing was fused ({report.reason}): the fused run is stock ORT_ENABLE_ALL")
    if not full.ok and bisect_on_mismatch:
        result.bisection = bisect(runner, ops)
        result.suggestion = suggest(result, label or "MODEL.onnx")
    result.ort_runs = runner.runs
    return result


def suggest(result: VerifyResult, model_arg: str) -> dict | None:
    """How to leave the blamed fused ops out: the ``fusion_pattern_id`` value and the
    ``ortfuse-annotate`` command (pattern ids select whole patterns, never single instances)."""
    b = result.bisection
    if b is None or not b.baseline_ok:
        return None
    blamed = b.culprits + [op for g in b.interactions for op in g]
    if not blamed:
        return None
    bad = sorted({op.pattern_id for op in blamed})
    used = {op.pattern_id for op in result.fused_ops}  # ids that fuse nothing here change nothing
    keep = [p for p in result.patterns if p in used and p not in bad]
    total = {p: sum(op.pattern_id == p for op in result.fused_ops) for p in bad}
    count = {p: sum(op.pattern_id == p for op in blamed) for p in bad}
    if keep:
        command = f"ortfuse-annotate {model_arg} " + " ".join(f"--pattern {p}" for p in keep)
        value = ",".join(keep)
    else:
        command = f"ortfuse-annotate {model_arg} --disable"
        value = ""
    partial = [p for p in bad if count[p] < total[p]]
    note = ""
    if partial:
        note = ("pattern ids select whole patterns: leaving out only the blamed instance(s) is not possible with "
                "fusion_pattern_id, so this leaves out " + ", ".join(
                    f"all {total[p]} fused {p} op(s) ({count[p]} blamed)" for p in partial)
                + "; from Python, ortfuse.fuse(model, fusion_patterns, keep=...) can leave out single instances")
    return {"leave_out": bad, "fusion_pattern_id": value, "fusion_enabled": "true" if keep else "false",
            "command": command, "note": note}


# --------------------------------------------------------------------------- text


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}g}"


def _op_line(op: FusedOp) -> str:
    return f"{op.pattern_id} (fused op {op.fused_node or '?'}) replacing {', '.join(op.nodes)}"


def format_text(r: VerifyResult) -> str:
    """The human-readable report the CLI prints."""
    counts: dict[str, int] = {}
    for op in r.fused_ops:
        counts[op.pattern_id] = counts.get(op.pattern_id, 0) + 1
    fused = ", ".join(f"{p}: {n}" for p, n in counts.items()) or "none"
    lines = [f"ortfuse verify {r.model}",
             f"reference: stock onnxruntime ORT_DISABLE_ALL; fused: ortfuse, {len(r.fused_ops)} fused op(s) ({fused})",
             "inputs (" + r.input_source + "): "
             + ", ".join(f"{k} {v['dtype']}{v['shape']}" for k, v in r.inputs.items()),
             f"tolerance: |fused - ref| <= atol + rtol*|ref|, atol={r.atol:g} rtol={r.rtol:g}"]
    if r.error:
        lines.append(f"fused run failed: {r.error}")
    else:
        rows = [("output", "shape", "max abs", "max rel", "worst element: fused vs reference", "")]
        for d in r.outputs:
            worst = d.problem or (f"{d.worst_index}: {_fmt(d.fused_value, 7)} vs {_fmt(d.reference_value, 7)}"
                                  if d.worst_index is not None else "-")
            rows.append((d.name, str(d.shape), _fmt(d.max_abs), _fmt(d.max_rel), worst, "ok" if d.ok else "MISMATCH"))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        lines += [("  ".join(c.ljust(w) for c, w in zip(row[:5], widths)) + "  " + row[5]).rstrip() for row in rows]
    for note in r.notes:
        lines.append(f"note: {note}")
    b = r.bisection
    if r.ok:
        lines.append(f"result: within tolerance ({r.ort_runs} ORT runs)")
        return "\n".join(lines)
    bad = sum(not d.ok for d in r.outputs)
    lines.append("result: MISMATCH" + (f" in {bad} of {len(r.outputs)} output(s)" if not r.error else ""))
    if b is None:
        lines.append(f"{r.ort_runs} ORT runs")
        return "\n".join(lines)
    lines.append(f"bisection over {b.candidates} fused op(s): {b.runs} ORT runs "
                 f"(one culprit needs at most 2*ceil(log2 n)+2 = {run_bound(b.candidates)}); "
                 f"{r.ort_runs} ORT runs in all")
    if not b.baseline_ok:
        lines.append("stock ORT_ENABLE_ALL with nothing fused already differs from ORT_DISABLE_ALL beyond the "
                     "tolerance: the mismatch is ORT's own optimisation, not a fused op (raise --atol/--rtol?)")
        return "\n".join(lines)
    if not b.candidates:
        lines.append("no op was fused, yet the fused run differs: nothing to bisect")
    for op in b.culprits:
        err = b.errors.get(op.fused_node)
        lines.append("culprit: " + _op_line(op) + (f" (raises {err})" if err else ""))
    for group in b.interactions:
        lines.append(f"interaction: these {len(group)} fused ops fail together, yet each half of them passes alone "
                     "(no single op is to blame):")
        lines += ["  " + _op_line(op) for op in group]
    if b.confirmed is True:
        lines.append("confirmed: every other fused op together is within tolerance")
    elif b.confirmed is False:
        lines.append("NOT confirmed: the remaining fused ops still mismatch together (an interaction across "
                     "the groups tested); leaving out only the ops named above is not enough")
    s = r.suggestion
    if s:
        lines.append(f"to leave out {', '.join(s['leave_out'])}: fusion_pattern_id={s['fusion_pattern_id']!r}"
                     if s["fusion_pattern_id"] else f"to leave out {', '.join(s['leave_out'])}: fusion_enabled=false "
                                                    "(no other pattern fuses anything in this model)")
        lines.append(f"  {s['command']}")
        if s["note"]:
            lines.append(f"  note: {s['note']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI


def add_arguments(p) -> None:
    p.add_argument("model", help="path of the .onnx model (or a zoo model name)")
    add_input_arguments(p)
    p.add_argument("--atol", type=float, default=DEFAULT_ATOL, help=f"absolute tolerance (default {DEFAULT_ATOL:g})")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help=f"relative tolerance (default {DEFAULT_RTOL:g})")
    p.add_argument("--patterns", "--pattern", nargs="+", action="extend", dest="patterns", metavar="ID",
                   help="pattern ids to fuse (default: the model's fusion_pattern_id, else all)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the random inputs")
    p.add_argument("--no-bisect", action="store_true", help="report the mismatch without bisecting")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args) -> int:
    from ortfuse import models
    from ortfuse.fusion.catalogue import UnknownPatternError
    from ortfuse.ir import feeds, model_args

    try:
        if args.atol < 0 or args.rtol < 0:
            raise VerifyError("--atol and --rtol must not be negative")
        path = models.resolve(args.model)
        model = model_args.load(path)
        made = command_inputs(model, args, seed=args.seed)
        result = verify(model, made.feeds, default_patterns(model, args.patterns), args.atol, args.rtol,
                        bisect_on_mismatch=not args.no_bisect, label=path, input_source=made.source)
    except (VerifyError, feeds.FeedError, model_args.ModelArgError, UnknownPatternError) as exc:
        msg = str(exc).rstrip(".") + "."
        print(f"ortfuse verify: {msg}", file=sys.stderr)
        if getattr(args, "json", False):
            print(json.dumps({"ok": False, "exit_status": 2, "error": msg}))
        return 2
    result.notes = made.notes + result.notes
    print(result.to_json() if args.json else format_text(result))
    return 0 if result.ok else 1
