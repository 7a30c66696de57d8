"""Measuring the kernel ranking of this machine (stored by ``ortfuse.kernel_choice.ranking``) on a model, in
context: for each class of matches (fused op, epilogue, dtype) with more than one candidate, the
whole model runs once per candidate serving every match of the class (the other classes on their
static choice) and once with the class left to ORT, all in one interleaved run (single runs A B B A,
``ortfuse.foundation.protocol``) beside stock ORT. A form's effect on ORT's layout (the reorders its
NCHWc transformer adds around ops it cannot block) is inside the time, which an isolated subgraph
cannot show (docs/ARCHITECTURE.md §8).

The class's static choice stays first unless a candidate beats it by ``MARGIN`` in the median and
in every repeat; a candidate whose outputs differ from stock ORT's beyond the tolerance is dropped.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.foundation import protocol, yielding
from ortfuse.foundation.session_options import measuring_options
from ortfuse.fusion.provenance import native_op_types, reference_op_inputs
from ortfuse.fusion.rewrite import fuse
from ortfuse.fusion.rulekit.result import Match
from ortfuse.ir.graph import GraphIndex
from ortfuse.kernel_choice import ranking, registry
from ortfuse.kernel_choice.op_registration import with_custom_ops
from ortfuse.kernel_choice.selection import choose_kernel

MARGIN = 0.03  # a candidate displaces the static choice only when this much faster, in every repeat
KEEP_LIMIT = 0.99  # auto keeps a class when its kernel runs the whole model at most this fraction of ORT's
REPEATS = 3
MIN_RUNS, MAX_RUNS = 3, 40
RTOL = ATOL = 1e-4  # |candidate - stock| <= ATOL * max(1, max|stock|) + RTOL * |stock| (BN folding rounds)
STOCK = "stock"


@dataclass
class ClassResult:
    """One class: its candidates' whole-model p50 (ms), ratios per repeat to the static choice, the order."""

    key: str
    static: str
    p50_ms: dict[str, float] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)  # candidate -> why it was not timed
    order: list[str] = field(default_factory=list)
    matches: list[list[str]] = field(default_factory=list)  # the node names of the class's matches

    def verdict(self) -> tuple[bool, str] | None:
        """Whether the kernel ranked first beats the class left to ORT in the whole model: in every
        repeat and by ``KEEP_LIMIT`` in the median (what ``fusion="auto"`` keeps); None when the two
        were not both timed."""
        best = self.order[0] if self.order else ""
        if best == ranking.ORT:
            return False, "auto: left to ORT: unfused ran the whole model fastest (kernel ranking)"
        if best not in self.ratios or ranking.ORT not in self.ratios:
            return None
        per_repeat = [b / o for b, o in zip(self.ratios[best], self.ratios[ranking.ORT])]
        median = statistics.median(per_repeat)
        text = (f"{best} ran the whole model {median:.3f}x its time with this kind of match left to ORT "
                f"(repeats {min(per_repeat):.3f}-{max(per_repeat):.3f}; kernel ranking, in context)")
        if median <= KEEP_LIMIT and max(per_repeat) < 1:
            return True, f"auto: {text}"
        return False, f"auto: {text}: not {KEEP_LIMIT:.2f} or better in every repeat"


def _class(m: Match) -> str:
    return ranking.class_of(m.op, m.attrs.get("activation", ""), m.dtype)


def _kernel_id(kernel: registry.Kernel) -> str:
    return f"{registry.LOWERED}:{kernel.form}" if kernel.path == registry.LOWERED else kernel.path


def _members(model: onnx.ModelProto, ids, precision: str) -> dict[str, list[Match]]:
    """The legal matches of ``model`` by class."""
    members: dict[str, list[Match]] = {}

    def observe(m: Match) -> str:
        members.setdefault(_class(m), []).append(m)
        return ranking.STATIC

    fuse(model, ids, kernels=observe, precision=precision)
    return members


def candidates(model: onnx.ModelProto, ids, precision: str = registry.FP32,
               members: dict[str, list[Match]] | None = None) -> dict[str, tuple[str, list[str]]]:
    """class key -> (static choice, the kernel ids that serve at least one of its matches, ORT last).
    The static choice is the first of them in the registry's priority order."""
    members = _members(model, ids, precision) if members is None else members  # ``rank`` has them already
    ix = GraphIndex(model)  # choose_kernel reads shapes and the opset only
    out = {}
    for key, matches in members.items():
        op, variant, dtype = key.split("|")
        fitting: list[str] = []
        for kernel in registry.kernels_for(op):  # priority order
            kid = _kernel_id(kernel)
            if kernel.path == registry.REFERENCE or kid in fitting or not kernel.serves(variant) \
                    or dtype not in kernel.dtypes or kernel.precision != registry.FP32:
                continue
            if any(choose_kernel(ix, m, kid, precision)[0].kernel is not None for m in matches):
                fitting.append(kid)
        if fitting:
            out[key] = (fitting[0], fitting + [ranking.ORT])
    return out


def _session(model: onnx.ModelProto, threads: int):
    """A stock ORT session on a fused model with ortfuse's native ops registered, as a fused session
    runs it; a model that needs reference (Python-op) kernels is not ranked."""
    import onnxruntime as ort

    if reference_op_inputs(model) is not None:
        raise RuntimeError("this kernel needs the reference (Python-op) path here")
    so = measuring_options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads=threads, spinning=False)
    if any(n.domain == DOMAIN for n in model.graph.node):
        so, why_not = with_custom_ops(so, frozenset(native_op_types(model)), python_ops=False)
        if why_not:
            raise RuntimeError(why_not)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _close(got, ref) -> bool:
    return all(g.shape == r.shape and bool(np.all(np.abs(g - r) <= ATOL * max(1.0, float(np.abs(r).max()))
                                                  + RTOL * np.abs(r))) for g, r in zip(got, ref))


def rank(model: onnx.ModelProto, ids, feeds: dict, threads: int = 0, budget_s: float = 60.0,
         precision: str = registry.FP32, progress: Callable[[str], None] | None = None) -> list[ClassResult]:
    """Measure every class of ``model`` with alternatives; the results (not yet stored: ``store``).
    ``budget_s`` bounds the wall time (fusing, creating sessions and timing): a candidate not reached
    is dropped with the reason, and a class left with nothing to compare gets no order."""
    import onnxruntime as ort

    so = measuring_options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, threads=threads, spinning=False)
    reference = yielding.run_session(ort.InferenceSession(model.SerializeToString(), so,
                                                          providers=["CPUExecutionProvider"]), feeds)
    stock = ort.InferenceSession(model.SerializeToString(),
                                 measuring_options(ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads=threads,
                                                   spinning=False), providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    members = _members(model, ids, precision)
    classes = candidates(model, ids, precision, members)
    results = []
    for i, (key, (static, kernel_ids)) in enumerate(classes.items()):
        result = ClassResult(key, static)
        # node names identify a class's matches in the tuner's report (unnamed nodes: none recorded)
        result.matches = [[n.name for n in m.nodes] for m in members.get(key, []) if all(n.name for n in m.nodes)]
        results.append(result)
        runners: dict[str, Callable] = {STOCK: lambda: yielding.run_session(stock, feeds)}
        for kid in kernel_ids:
            if time.perf_counter() - start >= budget_s:
                result.dropped[kid] = f"not timed: the ranking's budget of {budget_s:g} s was spent"
                continue
            fused, _ = fuse(model, ids, kernels=lambda m, kid=kid, key=key: kid if _class(m) == key else ranking.STATIC,
                            precision=precision)
            try:
                sess = _session(fused, threads)
                out = yielding.run_session(sess, feeds)
            except Exception as exc:  # a candidate ORT cannot load or run here is not ranked
                result.dropped[kid] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                continue
            if not _close(out, reference):
                result.dropped[kid] = f"outputs differ from stock ORT's beyond rtol {RTOL:g}, atol {ATOL:g}"
                continue
            runners[kid] = (lambda s=sess: yielding.run_session(s, feeds))
        if static not in runners or len(runners) < 3:  # nothing to compare: no order is stored for it
            continue
        if progress:
            progress(f"{key}: timing {', '.join(k for k in runners if k != STOCK)}")
        t0 = time.perf_counter()
        for fn in runners.values():
            fn()
        once = max(time.perf_counter() - t0, 1e-6)
        share = max(budget_s - (time.perf_counter() - start), 0.0) / (len(classes) - i)  # this class's time
        runs = int(min(MAX_RUNS, max(MIN_RUNS, share / REPEATS / once)))
        raw = yielding.measure(runners, runs=runs, repeats=REPEATS, warmup=1)
        for kid, lat in raw.items():
            result.p50_ms[kid] = statistics.median(protocol.p50_per_repeat(lat))
            result.ratios[kid] = protocol.ratio_per_repeat(lat, raw[static])
        result.order = _order(result, [k for k in runners if k != STOCK])
    return results


def _order(result: ClassResult, timed: list[str]) -> list[str]:
    """Fastest first; the static choice keeps first place unless beaten by MARGIN in every repeat."""
    by_time = sorted(timed, key=lambda k: result.p50_ms[k])
    best = by_time[0]
    if best != result.static and not (statistics.median(result.ratios[best]) <= 1 - MARGIN
                                      and max(result.ratios[best]) < 1):
        best = result.static
    return [best] + [k for k in by_time if k != best]


def store(results: list[ClassResult], model_name: str, threads: int) -> str:
    """Merge the measured orders into this machine's ranking file; returns its path."""
    classes = {r.key: {"order": r.order, "static": r.static, "model": model_name, "threads": threads,
                       "p50_ms": {k: round(v, 4) for k, v in r.p50_ms.items()},
                       "ratios_to_static": {k: [round(x, 4) for x in v] for k, v in r.ratios.items()},
                       "dropped": r.dropped}
               for r in results if r.order}
    return str(ranking.record(classes)) if classes else ""
