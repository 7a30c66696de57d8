"""Parity of ``ortfuse.backend`` with ``onnxruntime.backend`` on the ONNX backend test suite.

Every case that the installed ``onnx`` generates (node, simple, pytorch-converted, pytorch-operator
and real/light models, for each device) is run through both backends in the same process, by onnx's
own ``BackendTest`` runner (its tolerances, its data loading). The outcome of each case (passed,
skipped, or failed with an exception type) must be the same for both: there is no skip list, a case
that fails on stock ORT must fail the same way through ortfuse. Cases are split into shards so that
``pytest -n 2`` spreads them; each shard asserts parity of its own cases, and the totals are printed
(with ``-s``) and summed in the terminal summary by ``conftest.py``.
"""

from __future__ import annotations

import collections
import functools
import unittest
from typing import NamedTuple

import onnx.backend.test
import onnxruntime
import onnxruntime.backend
import pytest

import ortfuse
import ortfuse.backend

N_SHARDS = 4
PROPERTY = "onnx_backend_parity"  # user property read by conftest.pytest_terminal_summary


class Outcome(NamedTuple):
    """One backend's result for one case; ``kind`` and ``exc_type`` are what parity compares."""

    kind: str  # "passed" | "skipped" | "failed"
    exc_type: str = ""
    detail: str = ""  # skip reason or first lines of the exception, for messages only

    def key(self) -> tuple[str, str]:
        return self.kind, self.exc_type

    def __str__(self) -> str:
        head = f"{self.kind} ({self.exc_type})" if self.exc_type else self.kind
        return f"{head}: {self.detail}" if self.detail else head


class _OutcomeResult(unittest.TestResult):
    """Keeps the outcome of the single test run through it, with the exception type."""

    outcome: Outcome | None = None

    def _failed(self, err) -> None:
        exc_type, exc, _ = err
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = " / ".join(lines[:3])[:300]  # numpy's assertions name the mismatch on their 2nd-3rd lines
        self.outcome = Outcome("failed", f"{exc_type.__module__}.{exc_type.__qualname__}", detail)

    def addError(self, test, err):  # unittest.TestResult API
        self._failed(err)

    def addFailure(self, test, err):
        self._failed(err)

    def addSkip(self, test, reason):
        self.outcome = Outcome("skipped", detail=reason)

    def addSuccess(self, test):
        self.outcome = Outcome("passed")

    def addExpectedFailure(self, test, err):  # no xfail patterns are set; never a pass
        self._failed(err)

    def addUnexpectedSuccess(self, test):
        self.outcome = Outcome("failed", "unittest.UnexpectedSuccess")


class _RecordingBackend:
    """A backend module's API, recording the session type and fusion setting of every prepared rep."""

    def __init__(self, module) -> None:
        self.module = module
        self.sessions: collections.Counter[tuple[type, object]] = collections.Counter()
        self.fused = 0  # sessions whose fusion_report says a rewrite was applied

    def prepare(self, model, device=None, **kwargs):
        rep = self.module.prepare(model, device, **kwargs)
        session = rep._session
        self.sessions[type(session), getattr(session, "fusion", "n/a")] += 1
        self.fused += bool(getattr(getattr(session, "fusion_report", None), "applied", False))
        return rep

    def supports_device(self, device):
        return self.module.supports_device(device)

    def is_compatible(self, model, device=None, **kwargs):
        return self.module.is_compatible(model, device, **kwargs)


BACKENDS = {"onnxruntime": onnxruntime.backend, "ortfuse": ortfuse.backend}


@functools.cache
def _suites() -> tuple[dict[str, _RecordingBackend], dict[str, dict[str, unittest.TestCase]]]:
    """Per backend: its recorder and its runnable cases, keyed ``Category.test_name_device``."""
    recorders, suites = {}, {}
    for name, module in BACKENDS.items():
        recorder = _RecordingBackend(module)
        cases = {}
        for category, case_class in onnx.backend.test.BackendTest(recorder, __name__).test_cases.items():
            short = category.removeprefix("OnnxBackend").removesuffix("Test")
            for attr in dir(case_class):
                if attr.startswith("test_"):
                    cases[f"{short}.{attr}"] = case_class(attr)
        recorders[name], suites[name] = recorder, cases
    return recorders, suites


def _device(case_id: str) -> str:
    return case_id.rsplit("_", 1)[-1]


def _device_then_name(case_id: str) -> tuple[str, str]:
    return _device(case_id), case_id


def _verdict(stock: Outcome, fused: Outcome) -> str:
    """How ortfuse's outcome differs from stock's, for the failure message (any difference fails)."""
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    if rank[fused.kind] == rank[stock.kind]:
        return "another exception type"
    return "ortfuse worse" if rank[fused.kind] > rank[stock.kind] else "ortfuse better: still not parity"


def _run_case(case: unittest.TestCase) -> Outcome:
    result = _OutcomeResult()
    case.run(result)
    assert result.outcome is not None, f"unittest reported no outcome for {case.id()}"
    return result.outcome


def _summary(
    shard: str, outcomes: dict[str, dict[str, Outcome]], devices: collections.Counter, fused: int, differing: int
) -> dict:
    counts = {b: dict(collections.Counter(o.kind for o in per.values())) for b, per in outcomes.items()}
    cases = len(next(iter(outcomes.values())))
    return {
        "shard": shard,
        "cases": cases,
        "devices": dict(devices),
        "counts": counts,
        "fused_sessions": fused,
        "differing": differing,
    }


def _format_summary(summary: dict) -> str:
    devices = " + ".join(f"{n} {d}" for d, n in sorted(summary["devices"].items()))
    lines = [f"ONNX backend parity {summary['shard']}: {summary['cases']} cases ({devices})"]
    for backend, counts in summary["counts"].items():
        parts = ", ".join(f"{counts.get(k, 0)} {k}" for k in ("passed", "failed", "skipped"))
        lines.append(f"  {backend}.backend: {parts}")
    lines.append(f"  ortfuse sessions with a fusion applied: {summary['fused_sessions']}")
    lines.append(f"  cases with different outcomes: {summary['differing']}")
    return "\n".join(lines)


@pytest.fixture
def quiet_ort():
    """Only fatal messages from ORT's logger while thousands of sessions are made (ORT's default is 2,
    warnings); the errors it would log reach the outcomes as exceptions anyway."""
    onnxruntime.set_default_logger_severity(4)
    yield
    onnxruntime.set_default_logger_severity(2)


@pytest.mark.filterwarnings("ignore::RuntimeWarning:onnx.backend.test.case")  # onnx building its expected data
@pytest.mark.parametrize("shard", range(N_SHARDS), ids=lambda s: f"shard{s}of{N_SHARDS}")
def test_onnx_backend_outcomes_match(shard, tmp_path, monkeypatch, record_property, quiet_ort):
    """Each case of this shard has the same outcome through ortfuse.backend as through onnxruntime.backend."""
    recorders, suites = _suites()
    ids = sorted(suites["onnxruntime"], key=_device_then_name)  # so that every shard gets cpu cases
    assert ids == sorted(suites["ortfuse"], key=_device_then_name), "the backends were given different cases"
    assert len(ids) > 1000, f"onnx generated only {len(ids)} backend cases"
    mine = ids[shard::N_SHARDS]

    # Nothing may download (no network in CI) nor be shared between backends: one empty home each.
    monkeypatch.delenv("ONNX_MODELS", raising=False)
    homes = {name: tmp_path / f"onnx_home_{name}" for name in BACKENDS}
    outcomes: dict[str, dict[str, Outcome]] = {name: {} for name in BACKENDS}
    fused_before = recorders["ortfuse"].fused
    for case_id in mine:
        for name in BACKENDS:
            monkeypatch.setenv("ONNX_HOME", str(homes[name]))
            outcomes[name][case_id] = _run_case(suites[name][case_id])

    differing = [c for c in mine if outcomes["onnxruntime"][c].key() != outcomes["ortfuse"][c].key()]
    summary = _summary(
        f"shard{shard}of{N_SHARDS}",
        outcomes,
        collections.Counter(map(_device, mine)),
        recorders["ortfuse"].fused - fused_before,
        len(differing),
    )
    record_property(PROPERTY, summary)
    print("\n" + _format_summary(summary))

    # The comparison is only meaningful if stock ran stock sessions and ortfuse ran fused ones.
    stock_types = {t for t, _ in recorders["onnxruntime"].sessions}
    assert stock_types == {onnxruntime.InferenceSession}, f"stock backend created {stock_types}"
    ortfuse_sessions = recorders["ortfuse"].sessions
    assert ortfuse_sessions, "ortfuse.backend never prepared a session"
    wrong = {
        k: n for k, n in ortfuse_sessions.items() if not (issubclass(k[0], ortfuse.InferenceSession) and k[1] is True)
    }
    assert not wrong, f"ortfuse.backend prepared sessions that are not ortfuse.InferenceSession(fusion=True): {wrong}"
    assert summary["counts"]["onnxruntime"].get("passed", 0) > 0, "no case passed on stock ORT in this shard"

    if differing:
        report = "\n".join(
            f"  {c} ({_verdict(outcomes['onnxruntime'][c], outcomes['ortfuse'][c])})\n"
            f"    onnxruntime: {outcomes['onnxruntime'][c]}\n    ortfuse:     {outcomes['ortfuse'][c]}"
            for c in differing
        )
        pytest.fail(f"{len(differing)} of {len(mine)} cases differ between the backends:\n{report}", pytrace=False)


def test_outcome_classification():
    """The classifier tells passes, skips and failures (with their exception type) apart."""

    class Cases(unittest.TestCase):
        def test_pass(self):
            pass

        @unittest.skip("because")
        def test_skip(self):
            pass

        def test_assert(self):
            raise AssertionError("mismatch")

        def test_error(self):
            raise ValueError("boom")

    assert _run_case(Cases("test_pass")) == Outcome("passed")
    assert _run_case(Cases("test_skip")) == Outcome("skipped", detail="because")
    assert _run_case(Cases("test_assert")).key() == ("failed", "builtins.AssertionError")
    assert _run_case(Cases("test_error")).key() == ("failed", "builtins.ValueError")
    assert _run_case(Cases("test_error")).key() != _run_case(Cases("test_assert")).key()
