"""Measuring ``fusion="auto"``'s decisions: each legal match cut out into a subgraph and timed against
stock ORT, then the whole model with the kept fusions (docs/ARCHITECTURE.md §8).

The tuner first tries ``whole_plan``: every legal match fused, in the plan a session runs, timed
against stock ORT as a whole with an A/A control (a second stock session); when that wins
(``judge.judge`` at ``MODEL_LIMIT``) every match is kept and nothing below runs. Otherwise
``measure``, per legal match found by ``fuse``:
- cut the replaced nodes out into a standalone model, constants as initializers, fed with the very
  tensors they receive in the model (one stock ORT run on sample inputs records them: real shapes,
  real values);
- time stock ORT on that subgraph against ortfuse's replacement of it (``fuse`` of the same pattern,
  with the kernel the match gets in the whole model: otherwise it is not measured), both at the
  caller's optimization level and thread count, single runs interleaved A B B A
  (``ortfuse.foundation.protocol``), median over repeats; matches with equal kernel, op types,
  attributes, shapes and constants (values too) are measured once;
- keep the fusion when ``fused_ms <= (1 - MARGIN) * ort_ms``, it was faster in every repeat, and its
  outputs agree with ORT's.
Then the whole model with the kept fusions is timed against two stock ORT sessions as the whole plan
is; unless ``judge.judge`` passes it at ``MODEL_LIMIT``, nothing is kept (the guarantee: ``auto`` is
never slower than ORT; a fusion that only ties ORT within the noise of this machine is not worth it).

Never raises for a model ORT loads: a failure comes back as decisions not to fuse, with the reason
(``Tuning.failure`` when the sample run or the whole-model check fails), and measuring stops after
``BUDGET_S`` (the matches not reached stay unfused; ``Tuning.budget_spent``).

Fused models run on stock ORT sessions with ortfuse's ops registered (``ortfuse.runtime``), as
``ortfuse.InferenceSession`` runs a model ``fuse`` rewrote.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.foundation import protocol, yielding
from ortfuse.foundation.session_options import PRECISION_OPTION, measuring_options
from ortfuse.fusion.provenance import native_op_types, reference_op_inputs
from ortfuse.fusion.rewrite import fuse
from ortfuse.ir.graph import GraphIndex
from ortfuse.kernel_choice import registry
from ortfuse.kernel_choice.op_registration import warn_native_fallback, with_custom_ops
from ortfuse.kernel_choice.reference_runs import run_guarded
from ortfuse.tune import judge, plan_choice, steps
from ortfuse.tune.decisions import MARGIN, MODEL_LIMIT, Decision, Tuning, budget_reason, constants_digest
from ortfuse.tune.output_check import BF16_MATCH_ATOL, BF16_MATCH_RTOL, CHECK_ATOL, CHECK_RTOL, differing_output

BUDGET_S = 30.0  # wall time of one measure(): matches not reached by then are left to ORT, unmeasured
SUBGRAPH_BUDGET_S = 0.25  # timed wall time per distinct subgraph (both sides together)
MODEL_BUDGET_S = 3.0  # timed wall time of the whole-model check
REPEATS = 3
CLEAR_LOSS = 2.0  # a fused subgraph this many times slower than ORT at first look is not timed further
# passes per repeat: at least MIN_RUNS x REPEATS passes in a look (11 wins of 12 pass the sign test at judge.ALPHA)
MIN_RUNS, MAX_RUNS = 4, 60
# the first look at a plan is this share of its budget: a clear win is judged on it and the plan reaches served
# runs sooner; a plan it does not settle gets full-budget looks (python tools/auto_bench.py --models public
# reports the time to plan)
FIRST_LOOK_SHARE = 0.25
CPU = ["CPUExecutionProvider"]


Verdict = tuple[bool, str, float, float]  # keep, reason, whole-model ms with the kernel, with the class left to ORT


def measure(model, ids, level, threads, sample, key, progress, precision=registry.FP32,
            budget_s: float = BUDGET_S, verdicts: dict[tuple[str, ...], Verdict] | None = None,
            check: bool = True) -> Tuning:
    """The decisions on every legal match of ``ids`` in ``model``, measured now on ``sample`` feeds.

    ``verdicts`` (node names -> verdict): matches the kernel ranking already judged in the whole
    model (``ortfuse.tune.rank_kernels``, with the kernel they get now); they take that verdict and are
    not cut out and measured alone, which cannot see their effect on ORT's layout.

    Never raises for a model ORT can load: when the sample run (or anything before the matches are
    measured) fails, the Tuning holds no kept decision and ``failure`` says what failed and what to do;
    a match whose subgraph fails is not kept, with the reason; once ``budget_s`` seconds are spent,
    the matches not yet measured are not kept (the whole-model check still runs, within
    ``MODEL_BUDGET_S``, when something was kept; ``check`` False: not here, the caller times the plan
    among others, ``compare_plans``); a failing whole-model check keeps nothing."""
    start = time.perf_counter()
    tuning = Tuning(key)
    try:
        _, report = fuse(model, ids, precision=precision)
    except Exception as exc:  # noqa: BLE001 - a model ORT loads is left to ORT, with the reason
        tuning.failure = f"finding the matches failed ({_brief(exc)}); the model runs as stock ORT"
        return tuning
    candidates = report.fused
    if not candidates:
        return tuning
    try:
        ix = GraphIndex(model, infer_shapes=False)
        by_name = {ix.name_of(n): n for n in ix.graph.node}
        cuts = [_cut(ix, [by_name[n] for n in rec.nodes]) for rec in candidates]
        digests = [constants_digest(ix, [by_name[n] for n in rec.nodes]) for rec in candidates]
        captured = _capture(model, {t for cut in cuts for t in cut.runtime_inputs + cut.outputs}, sample)
    except Exception as exc:  # noqa: BLE001 - ORT rejected the sample feeds (an index out of range, a Reshape...)
        tuning.failure = (f"the sample run on stock ORT failed ({_brief(exc)}); hand representative inputs "
                          "(`ortfuse tune MODEL --inputs data.npz`, or a session's own traffic) to measure")
        tuning.decisions = [Decision(rec.pattern_id, list(rec.nodes), False, f"auto: not measured: {tuning.failure}",
                                     kernel=rec.kernel) for rec in candidates]
        return tuning
    measured: dict[str, Decision] = {}
    matches_until = start + max(0.0, budget_s - MODEL_BUDGET_S)  # the whole-model check keeps its share
    with _progress_bar(len(candidates), progress) as bar:
        for rec, cut, constants in zip(candidates, cuts, digests):
            judged = (verdicts or {}).get(tuple(rec.nodes))
            if judged is not None:
                keep, reason, fused_ms, ort_ms = judged
                found = Decision(rec.pattern_id, [], keep, reason, fused_ms, ort_ms, rec.kernel, constants)
            else:
                found = _decide_match(model, rec, cut, constants, captured, measured, level, threads, precision,
                                      None if time.perf_counter() < matches_until else budget_s)
            tuning.budget_spent |= found.reason == budget_reason(budget_s)
            tuning.decisions.append(dataclasses.replace(found, pattern_id=rec.pattern_id, nodes=list(rec.nodes)))
            bar.update(1)
    if check and any(d.keep for d in tuning.decisions):
        try:
            tuning.model_check = _check_model(model, ids, tuning, level, threads, sample, precision)
        except Exception as exc:  # noqa: BLE001 - no check, no fusion: nothing is kept
            tuning.failure = f"the whole model with the kept fusions failed to run ({_brief(exc)}); nothing kept"
            why = f"auto: {tuning.failure}"
            tuning.decisions = [dataclasses.replace(d, keep=False, reason=why) if d.keep else d
                                for d in tuning.decisions]
    return tuning


def whole_plan(model, ids, level, threads, sample, key, precision: str = registry.FP32,
               budget_s: float = MODEL_BUDGET_S) -> tuple[Tuning | None, dict | None]:
    """Every legal match fused, in the plan a session runs (``_plan_runner``), checked and timed
    against two stock ORT sessions on ``sample`` (``_timed_verdict``): (a Tuning keeping every
    match, the check) when ``judge.judge`` passes it (faster than stock ORT in significantly many
    passes, by at least ``MODEL_LIMIT`` in the median pass and beyond the two stock sessions' bias;
    a median win without that evidence is timed again, the looks pooled, up to ``judge.MAX_LOOKS``);
    else (None, the check, or None when it could not run). A fused plan's gain often lies between its matches (ORT's
    layout around them, the regions the layout step runs blocked), which no cut-out subgraph shows,
    so the whole plan is judged first; each decision records the kernel its match gets and the
    digest of its constants, as a measured match's does."""
    import onnxruntime as ort

    try:
        fused, report = fuse(model, ids, precision=precision)
        if not report.fused:
            return None, None
        steps.mark("whole plan: fused")
        run, laid_out = _plan_runner(model, fused, report, _options(level, threads, precision))
        if run is None:
            return None, None
        steps.mark("whole plan: layout planned, session opened")
        serialized = model.SerializeToString()
        stock, control = (ort.InferenceSession(serialized, _options(level, threads), providers=CPU) for _ in "ab")
        expected, got = yielding.run_session(stock, sample), run(sample)
        if not _outputs_agree(expected, got, precision):
            return None, {"failure": "the whole plan's outputs differ from stock ORT's on the sample"}
        steps.mark("whole plan: stock sessions opened, outputs checked")
        runs = (lambda: run(sample), lambda: yielding.run_session(stock, sample),
                lambda: yielding.run_session(control, sample))
        verdict, looks = _timed_verdict(runs, budget_s)
    except Exception as exc:  # noqa: BLE001 - the matches are then measured one by one
        return None, {"failure": f"the whole plan could not be measured ({_brief(exc)})"}
    check = {**verdict.as_check(), "looks": looks, "fused_ops": len(report.fused), "whole_plan": True,
             "layout_step": laid_out}
    if not verdict.passed:
        return None, check
    ratio, ratios = verdict.ratio, verdict.ratios
    why = (f"auto: kept with every match fused: the whole plan ran {ratio:.3f}x stock ORT "
           f"(repeats {min(ratios):.3f}-{max(ratios):.3f}; {verdict.describe()}; {looks} look(s); "
           f"limit {MODEL_LIMIT:.2f})")
    return every_match_kept(model, report, key, check, why), check


def every_match_kept(model, report, key, check: dict, why: str) -> Tuning:
    """Decisions keeping every match of ``report`` (``fuse``'s report on ``model``, nothing left
    out), each with the kernel it gets and the digest of its constants, ``why`` as their reason."""
    ix = GraphIndex(model, infer_shapes=False)
    by_name = {ix.name_of(n): n for n in ix.graph.node}
    tuning = Tuning(key, model_check=check)
    tuning.decisions = [Decision(rec.pattern_id, list(rec.nodes), True, why, kernel=rec.kernel,
                                 constants=constants_digest(ix, [by_name[n] for n in rec.nodes]))
                        for rec in report.fused]
    return tuning


def _time_with_control(fused_run, ort_run, control_run, budget_s: float) -> dict[str, list[list[float]]]:
    """The protocol's timing (ms per configuration, repeat and pass) of ``fused_run`` against stock ORT
    (``ort_run``) and a second stock ORT session (``control_run``, the A/A control), interleaved in
    the same rounds, ``REPEATS`` repeats sized to ``budget_s``."""
    t0 = time.perf_counter()
    fused_run()
    ort_run()
    control_run()
    once = max(time.perf_counter() - t0, 1e-6)
    runs = int(min(MAX_RUNS, max(MIN_RUNS, budget_s / REPEATS / once)))
    return yielding.measure({"fused": fused_run, "ort": ort_run, "control": control_run}, runs=runs,
                            repeats=REPEATS, warmup=1)


def _timed_verdict(runs: tuple[Callable, Callable, Callable], budget_s: float) -> tuple[judge.Verdict, int]:
    """(verdict, looks): ``runs`` (fused, stock ORT, control) timed with ``_time_with_control`` and judged
    by ``judge.judge`` at ``MODEL_LIMIT``, first on ``FIRST_LOOK_SHARE`` of ``budget_s``; an
    inconclusive verdict is timed again on the whole budget and judged on all looks pooled, at most
    ``judge.MAX_LOOKS`` looks."""
    raw = _time_with_control(*runs, FIRST_LOOK_SHARE * budget_s)
    verdict, looks = judge.judge(raw, MODEL_LIMIT), 1
    steps.mark("timed look 1")
    while verdict.inconclusive and looks < judge.MAX_LOOKS:
        raw = judge.pooled(raw, _time_with_control(*runs, budget_s))
        verdict, looks = judge.judge(raw, MODEL_LIMIT), looks + 1
        steps.mark(f"timed look {looks}")
    return verdict, looks


def _plan_runner(model, fused, report, sess_options, layout_step: bool = True) -> tuple[Callable | None, bool]:
    """(a function running ``fused`` (``fuse``'s output for ``model``) as a session with that plan
    runs it, whether the layout step changed it): the layout step's rewrite at ORT_ENABLE_ALL (unless
    ``layout_step`` is False), ortfuse's ops registered, the ORT optimizers the plan disables; the
    function is None when it needs reference kernels or the native ops cannot be registered (the
    matches are then measured one by one)."""
    if reference_op_inputs(fused) is not None:
        return None, False
    from ortfuse.tune.layout_memo import plan_layout

    native = frozenset(native_op_types(fused))
    layout = plan_layout(model, fused, sess_options, native, report.disabled_ort_optimizers)[0] if layout_step else None
    if layout is not None:
        fused, native = layout.model, native | layout.native_ops
    run, why_not = _fused_runner(fused, sess_options, report.disabled_ort_optimizers, native)
    return (None if why_not else run), layout is not None


@dataclass
class Candidate:
    """One whole-model plan ``compare_plans`` times: the matches it keeps (``keep``: a ``fuse(keep=)``
    rule, None: every legal match) and whether the layout step runs on it."""

    keep: Callable | None = None
    layout_step: bool = True


def compare_plans(model, ids, level, threads, sample, candidates: dict[str, Candidate],
                  precision: str = registry.FP32, budget_s: float = MODEL_BUDGET_S) -> tuple[plan_choice.Choice | None,
                                                                                             dict[str, str], int]:
    """The candidate plans, each run as a session runs it (``_plan_runner``) and checked against
    stock ORT on ``sample``, timed against each other beside two stock ORT sessions in the same
    interleaved rounds (``_time_plans``) and chosen by ``plan_choice.choose`` at ``MODEL_LIMIT``; an
    inconclusive choice is timed again and chosen on the looks pooled, at most ``judge.MAX_LOOKS``.
    Returns (the choice, or None when no candidate could run; why each candidate left out was,
    looks). A candidate that fuses nothing, fails or computes otherwise than stock ORT is left out."""
    import onnxruntime as ort

    serialized = model.SerializeToString()
    stock, control = (ort.InferenceSession(serialized, _options(level, threads), providers=CPU) for _ in "ab")
    expected = yielding.run_session(stock, sample)
    runs: dict[str, Callable] = {}
    left_out: dict[str, str] = {}
    for name, c in candidates.items():
        try:
            fused, report = fuse(model, ids, keep=c.keep, precision=precision)
            run = _plan_runner(model, fused, report, _options(level, threads, precision), c.layout_step)[0] \
                if report.fused else None
            if run is None:
                left_out[name] = "fuses nothing" if not report.fused else "needs reference kernels or its ops failed"
            elif not _outputs_agree(expected, run(sample), precision):
                left_out[name] = "its outputs differ from stock ORT's on the sample"
            else:
                runs[name] = functools.partial(run, sample)
        except Exception as exc:  # noqa: BLE001 - the other candidates are still compared
            left_out[name] = f"failed ({_brief(exc)})"
    if not runs:
        return None, left_out, 0
    steps.mark("candidate plans opened")
    runs["ort"] = lambda: yielding.run_session(stock, sample)
    runs["control"] = lambda: yielding.run_session(control, sample)
    names = [n for n in candidates if n in runs]
    raw = _time_plans(runs, FIRST_LOOK_SHARE * budget_s)
    choice, looks = plan_choice.choose(raw, names, MODEL_LIMIT), 1
    steps.mark("candidate plans: look 1")
    while choice.inconclusive and looks < judge.MAX_LOOKS:
        raw = judge.pooled(raw, _time_plans(runs, budget_s))
        choice, looks = plan_choice.choose(raw, names, MODEL_LIMIT), looks + 1
        steps.mark(f"candidate plans: look {looks}")
    return choice, left_out, looks


def _time_plans(runs: dict[str, Callable], budget_s: float) -> dict[str, list[list[float]]]:
    """The protocol's timing (ms per configuration, repeat and pass) of ``runs`` (the candidates,
    ``ort`` and ``control``) interleaved in the same rounds, ``REPEATS`` repeats sized to ``budget_s``."""
    t0 = time.perf_counter()
    for run in runs.values():
        run()
    once = max(time.perf_counter() - t0, 1e-6)
    count = int(min(MAX_RUNS, max(MIN_RUNS, budget_s / REPEATS / once)))
    return yielding.measure(runs, runs=count, repeats=REPEATS, warmup=1)


def _outputs_agree(expected, got, precision: str) -> bool:
    """Whole-model outputs within the live swap's tolerance (``tune.output_check``)."""
    names = [str(i) for i in range(len(expected))]
    return differing_output(names, expected, got, precision == registry.BF16) is None


def _decide_match(model, rec, cut: _Cut, constants: str, captured: dict, measured: dict[str, Decision], level,
                  threads, precision: str, spent_budget: float | None) -> Decision:
    """The decision on one match (``rec``, a record of the unconstrained fuse; ``constants``, the
    digest of its constants): measured once per signature; a failure of its subgraph or a spent
    budget (``spent_budget``: the budget, in s) is a decision not to keep it, with the reason."""
    try:
        micro, micro_feeds = cut.model(model, captured)
        signature = cut.signature(micro_feeds, rec.kernel, constants)
        if signature in measured:
            return measured[signature]
        if spent_budget is not None:
            return Decision(rec.pattern_id, [], False, budget_reason(spent_budget), kernel=rec.kernel,
                            constants=constants)
        found = _measure_subgraph(micro, micro_feeds, rec.pattern_id, level, threads, precision, rec.kernel)
    except Exception as exc:  # noqa: BLE001 - this match stays as ORT runs it; the others go on
        return Decision(rec.pattern_id, [], False, f"auto: measuring its subgraph failed ({_brief(exc)}); "
                                                   "left to ORT", kernel=rec.kernel, constants=constants)
    found = dataclasses.replace(found, constants=constants)
    measured[signature] = found
    return found


def _brief(exc: BaseException) -> str:
    """The first line of an exception's message, shortened: for one-sentence reasons."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


@dataclass
class _Cut:
    """The nodes of one match, with what they read from the rest of the graph."""

    nodes: list[onnx.NodeProto]
    runtime_inputs: list[str]
    constants: dict[str, np.ndarray]
    outputs: list[str]

    def model(self, whole: onnx.ModelProto, captured: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, dict]:
        micro_feeds = {t: captured[t] for t in self.runtime_inputs}
        inputs = [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                  for t, a in micro_feeds.items()]
        outputs = [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(captured[t].dtype),
                                                 captured[t].shape) for t in self.outputs]
        inits = [numpy_helper.from_array(v, name) for name, v in self.constants.items()]
        graph = helper.make_graph(list(self.nodes), "ortfuse_tune_subgraph", inputs, outputs, initializer=inits)
        micro = helper.make_model(graph, opset_imports=list(whole.opset_import))
        micro.ir_version = whole.ir_version
        return micro, micro_feeds

    def signature(self, micro_feeds: dict, kernel: str, constants: str) -> str:
        """Matches with equal signatures share one measurement: same kernel, op types, attributes,
        input shapes and dtypes, and constants (``constants``: their digest, with the values of the
        small ones, ``decisions.constants_digest``)."""
        h = hashlib.sha256(f"kernel:{kernel};constants:{constants}".encode())
        for n in self.nodes:
            h.update(f"{n.domain}:{n.op_type}:{[(a.name, str(helper.get_attribute_value(a))) for a in n.attribute]}"
                     .encode())
        for t in self.runtime_inputs:
            h.update(f"in{micro_feeds[t].shape}{micro_feeds[t].dtype}".encode())
        return h.hexdigest()


def _cut(ix: GraphIndex, nodes: list[onnx.NodeProto]) -> _Cut:
    inside = {id(n) for n in nodes}
    produced = {o for n in nodes for o in n.output if o}
    runtime, constants = [], {}
    for n in nodes:
        for t in n.input:
            if not t or t in produced or t in runtime or t in constants:
                continue
            value = ix.const(t)
            if value is None:
                runtime.append(t)
            else:
                constants[t] = value
    outputs = [o for n in nodes for o in n.output if o and (
        o in ix.graph_outputs or any(id(c) not in inside for c in ix.consumers_of(o)))]
    return _Cut(sorted(nodes, key=lambda n: ix.position[id(n)]), runtime, constants, outputs or [nodes[-1].output[0]])


def _capture(model: onnx.ModelProto, tensors: set[str], sample: dict) -> dict[str, np.ndarray]:
    """The values of ``tensors`` when the model runs on ``sample`` (stock ORT, ORT_DISABLE_ALL)."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {o.name for o in probe.graph.output}
    wanted = sorted(tensors)
    extra = [t for t in wanted if t not in present and t not in sample]
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in extra)
    so = _options(ort.GraphOptimizationLevel.ORT_DISABLE_ALL, 0)
    sess = ort.InferenceSession(probe.SerializeToString(), so, providers=CPU)
    names = [o.name for o in sess.get_outputs()]
    values = dict(zip(names, yielding.run_session(sess, sample)))
    values.update(sample)
    return {t: values[t] for t in wanted}


def _options(level, threads: int, precision: str = registry.FP32):
    so = measuring_options(level, threads=threads, spinning=False)
    if precision != registry.FP32:
        so.add_session_config_entry(PRECISION_OPTION, precision)
    return so


def _fused_runner(fused: onnx.ModelProto, sess_options, disabled_optimizers=(),
                  native: frozenset | None = None) -> tuple[Callable | None, str]:
    """A function running ``fused`` (a model ``fuse`` returned) on its feeds, on stock ORT with
    ortfuse's ops registered (``native``: the native op types, default those ``fuse`` wrote) and runs
    guarded where it holds reference kernels, as ``ortfuse.InferenceSession`` runs it; or (None, why
    the native ops could not be registered)."""
    import onnxruntime as ort

    reference_inputs = reference_op_inputs(fused)
    if any(n.domain == DOMAIN for n in fused.graph.node):
        native = frozenset(native_op_types(fused)) if native is None else native
        sess_options, why_not = with_custom_ops(sess_options, native, python_ops=reference_inputs is not None)
        if why_not:
            return None, why_not
    extra = {"disabled_optimizers": set(disabled_optimizers)} if disabled_optimizers else {}
    sess = ort.InferenceSession(fused.SerializeToString(), sess_options, providers=CPU, **extra)
    if reference_inputs is None:
        return (lambda feeds: yielding.run_session(sess, feeds)), ""
    return (lambda feeds: yielding.run(lambda options: run_guarded(sess.run, options, False, None, feeds))), ""


def _fuse_and_open(model, ids, sess_options, keep=None, precision: str = registry.FP32, *, disable: bool = True):
    """(run function, report) of ``model`` fused with ``ids``; when the native ops cannot be
    registered, fused again with kernels that need none (warned once, as a session does)."""
    fused, report = fuse(model, ids, keep=keep, precision=precision)
    run, why_not = _fused_runner(fused, sess_options, report.disabled_ort_optimizers if disable else ())
    if why_not:
        warn_native_fallback(why_not, stacklevel=4)
        fused, report = fuse(model, ids, registry.NO_NATIVE, keep=keep, precision=precision)
        run, _ = _fused_runner(fused, sess_options, report.disabled_ort_optimizers if disable else ())
    return run, report


def _measure_subgraph(micro: onnx.ModelProto, micro_feeds: dict, pattern_id: str, level, threads,
                      precision: str = registry.FP32, kernel: str = "") -> Decision:
    """The verdict on one cut-out match, measured with the kernel it gets there; when that is not
    ``kernel`` (the one it gets in the whole model), it is not measured: a decision must be about
    the kernel the model would run."""
    import onnxruntime as ort

    stock = ort.InferenceSession(micro.SerializeToString(), _options(level, threads), providers=CPU)
    fused, report = _fuse_and_open(micro, [pattern_id], _options(level, threads, precision), precision=precision)
    if len(report.fused) != 1:
        return Decision(pattern_id, [], False, "auto: the match does not fuse on its own subgraph "
                                               f"({report.reason}); left to ORT", kernel=kernel)
    got_kernel = report.fused[0].kernel
    if kernel and got_kernel != kernel:
        return Decision(pattern_id, [], False, f"auto: on its own subgraph the match gets kernel '{got_kernel}', "
                                               f"in the model '{kernel}'; not measured, left to ORT", kernel=kernel)
    return dataclasses.replace(_verdict(stock, fused, micro_feeds, pattern_id, precision), kernel=got_kernel)


def _verdict(stock, fused: Callable, micro_feeds: dict, pattern_id: str, precision: str) -> Decision:
    """Outputs checked against ORT's, then the fused subgraph timed against ORT's: keep or not, why."""
    expected, got = yielding.run_session(stock, micro_feeds), fused(micro_feeds)
    for e, g in zip(expected, got):
        rtol, atol = CHECK_RTOL, CHECK_ATOL
        if precision == registry.BF16:
            finite = np.abs(e[np.isfinite(e)]) if e.size else np.zeros(1)
            rtol, atol = BF16_MATCH_RTOL, BF16_MATCH_ATOL * max(1.0, float(finite.max()) if finite.size else 1.0)
        if e.shape != g.shape or not np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
            return Decision(pattern_id, [], False, f"auto: fused output differs from ORT's beyond rtol {rtol:g}, "
                                                   f"atol {atol:g}; left to ORT (run `ortfuse verify`)")
    fused_run, ort_run = (lambda: fused(micro_feeds)), (lambda: yielding.run_session(stock, micro_feeds))
    fused_ms, ort_ms = _best_of(fused_run, ort_run, 3)
    if fused_ms > CLEAR_LOSS * ort_ms:  # far behind: no need to time it precisely
        return Decision(pattern_id, [], False, f"auto: fused {fused_ms:.3f} ms vs ORT {ort_ms:.3f} ms on its subgraph "
                                               f"(best of 3; ratio {fused_ms / ort_ms:.2f})", fused_ms, ort_ms)
    fused_ms, ort_ms, ratios = _time_pair(fused_run, ort_run, SUBGRAPH_BUDGET_S)
    ratio = fused_ms / ort_ms
    if ratio <= 1 - MARGIN and max(ratios) < 1:
        return Decision(pattern_id, [], True, f"auto: fused {ratio:.2f}x ORT on its subgraph", fused_ms, ort_ms)
    why = f"ratio {ratio:.2f} > {1 - MARGIN:.2f}" if ratio > 1 - MARGIN else \
        f"ratio {ratio:.2f}, but {max(ratios):.2f} in one repeat: not faster in every repeat"
    return Decision(pattern_id, [], False, f"auto: fused {fused_ms:.3f} ms vs ORT {ort_ms:.3f} ms on its subgraph "
                                           f"({why})", fused_ms, ort_ms)


def _best_of(fused_run, ort_run, n: int) -> tuple[float, float]:
    """(fused, ORT) fastest of ``n`` alternated single runs after one untimed run each, in ms: a quick
    first look (first runs pay for allocations and thread-pool start-up)."""
    fused_run()
    ort_run()
    best = {"fused": float("inf"), "ort": float("inf")}
    for _ in range(n):
        for name, fn in (("fused", fused_run), ("ort", ort_run)):
            best[name] = min(best[name], yielding.timed(fn))
    return best["fused"], best["ort"]


def _time_pair(fused_run, ort_run, budget_s: float) -> tuple[float, float, list[float]]:
    """(fused p50, ORT p50, fused/ORT p50 ratio of each repeat): ms, medians over REPEATS of
    interleaved A B B A single runs."""
    t0 = time.perf_counter()
    fused_run()
    ort_run()
    once = max(time.perf_counter() - t0, 1e-6)
    runs = int(min(MAX_RUNS, max(MIN_RUNS, budget_s / REPEATS / once)))
    raw = yielding.measure({"fused": fused_run, "ort": ort_run}, runs=runs, repeats=REPEATS, warmup=1)
    p50 = {k: statistics.median(protocol.p50_per_repeat(v)) for k, v in raw.items()}
    return p50["fused"], p50["ort"], protocol.ratio_per_repeat(raw["fused"], raw["ort"])


def _check_model(model, ids, tuning: Tuning, level, threads, sample, precision: str = registry.FP32) -> dict:
    """The whole model with the kept fusions timed against two stock ORT sessions, as ``whole_plan``
    is (``_timed_verdict``); ``passed`` is the verdict."""
    import onnxruntime as ort

    serialized = model.SerializeToString()
    stock, control = (ort.InferenceSession(serialized, _options(level, threads), providers=CPU) for _ in "ab")
    # a model fuse rewrote runs as a session runs a saved-fused model: no ORT optimizer disabled
    fused, report = _fuse_and_open(model, ids, _options(level, threads, precision), tuning.keep_rule(), precision,
                                   disable=False)
    runs = (lambda: fused(sample), lambda: yielding.run_session(stock, sample),
            lambda: yielding.run_session(control, sample))
    verdict, looks = _timed_verdict(runs, MODEL_BUDGET_S)
    return {**verdict.as_check(), "looks": looks, "fused_ops": len(report.fused)}


@contextlib.contextmanager
def _progress_bar(total: int, enabled: bool):
    if enabled:
        from tqdm import tqdm

        with tqdm(total=total, desc="measuring fused ops", unit="op") as bar:
            yield bar
    else:
        class _Null:
            def update(self, n):
                pass

        yield _Null()
