"""Run ORT's own Python API tests against stock ORT and against ortfuse, and compare the outcomes.

Usage::

    python tools/ort_suite.py --ort-src PATH [--files NAME ...] [--workdir DIR] [--timeout SECONDS]

``PATH`` is an ONNX Runtime source tree (or an extract of it) holding ``onnxruntime/test/python`` and
``onnxruntime/test/testdata``. The test files (by default ``onnxruntime_test_python.py``,
``onnxruntime_test_python_iobinding.py`` and ``onnxruntime_test_python_backend.py``, whichever exist),
the other top-level modules of that folder (``helper.py``...) and the testdata are copied into a
fresh work directory per run; nothing is written into the source tree. Each run is a pytest
subprocess with a small plugin put on ``PYTHONPATH``:

- ``stock``: ORT as installed;
- ``ortfuse``: ``onnxruntime.InferenceSession`` is a subclass of ``ortfuse.InferenceSession`` whose
  ``fusion`` defaults to True, and the functions of ``onnxruntime.backend`` are those of
  ``ortfuse.backend``.

The tests find their models with ``helper.get_name``, which looks under ``./testdata`` and
``<test dir>/../testdata``; the work directory has ``python/`` (the tests) beside ``testdata/`` and
pytest runs from it. Prints the outcome table of each run (one row per test, and per unittest
subTest), totals and differences. Exits 1 if ortfuse does worse than stock on any test (passed ->
skipped/failed/error/missing, skipped -> failed/error/missing), or if the patch did not take effect;
2 on a usage or setup error.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_FILES = (
    "onnxruntime_test_python.py",
    "onnxruntime_test_python_iobinding.py",
    "onnxruntime_test_python_backend.py",
)
MODES = ("stock", "ortfuse")
PLUGIN = "_ort_suite_plugin"
# How bad an outcome is; ortfuse is "worse" when its rank is higher than stock's for the same test.
RANK = {"passed": 0, "xfailed": 0, "skipped": 1, "xpassed": 2, "failed": 2, "error": 2, "missing": 3}

PLUGIN_SOURCE = '''\
"""pytest plugin written by ortfuse's tools/ort_suite.py: records outcomes, patches ORT for ortfuse."""
import collections
import json
import os
import re

_OUT = os.environ["ORT_SUITE_OUT"]
_MODE = os.environ["ORT_SUITE_MODE"]
_STATS = collections.Counter()
_SEEN = collections.Counter()
_FUSED_IN = collections.Counter()  # test id -> sessions in which a fusion was applied
_CURRENT = [""]

import onnxruntime  # noqa: E402
import onnxruntime.backend  # noqa: E402

_STOCK_SESSION = onnxruntime.InferenceSession

if _MODE == "ortfuse":
    import ortfuse  # noqa: E402
    import ortfuse.backend  # noqa: E402

    class FusedSession(ortfuse.InferenceSession):
        """ortfuse.InferenceSession with fusion=True unless the caller says otherwise."""

        def __init__(self, *args, fusion=True, **kwargs):
            _STATS["sessions_created"] += 1
            super().__init__(*args, fusion=fusion, **kwargs)
            _STATS["sessions_fusion_true"] += self.fusion is True
            if getattr(self.fusion_report, "applied", False):
                _STATS["sessions_fused"] += 1
                _FUSED_IN[_CURRENT[0]] += 1

    def _prepare(model, device=None, **kwargs):
        rep = ortfuse.backend.prepare(model, device, **kwargs)
        session = getattr(rep, "_session", None)
        _STATS["backend_reps"] += 1
        _STATS["backend_reps_ortfuse_fusion_true"] += (
            isinstance(session, ortfuse.InferenceSession) and session.fusion is True
        )
        return rep

    onnxruntime.InferenceSession = FusedSession
    for _name in ("is_compatible", "run", "run_model", "run_node", "supports_device"):
        setattr(onnxruntime.backend, _name, getattr(ortfuse.backend, _name))
    onnxruntime.backend.prepare = _prepare


def _label(report):
    """The row name: the test id, plus the subTest description for subtest reports."""
    context = getattr(report, "context", None)
    if context is None:
        return report.nodeid
    parts = [f"[{context.msg}]"] if context.msg is not None else []
    parts += [f"{k}={re.sub(r' at 0x[0-9a-fA-F]+', '', repr(v))}" for k, v in sorted(context.kwargs.items())]
    label = f"{report.nodeid} {' '.join(parts) or '[subtest]'}"
    _SEEN[label] += 1
    return label if _SEEN[label] == 1 else f"{label} #{_SEEN[label]}"


def _outcome(report):
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.passed:
        return "passed"
    if report.skipped:
        return "skipped"
    return "failed" if report.when == "call" else "error"


def _message(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    crash = getattr(report.longrepr, "reprcrash", None)
    return crash.message if crash is not None else ""


def pytest_runtest_setup(item):
    _CURRENT[0] = item.nodeid


def pytest_runtest_logreport(report):
    outcome = _outcome(report)
    if report.when != "call" and outcome == "passed":
        return  # setup/teardown that went fine says nothing about the test
    row = {"id": _label(report), "subtest": hasattr(report, "context"), "outcome": outcome,
           "message": _message(report)[:300]}
    with open(_OUT, "a") as f:
        f.write(json.dumps(row) + "\\n")


def pytest_sessionfinish(session, exitstatus):
    stats = dict(_STATS, mode=_MODE, exitstatus=int(exitstatus), fused_in=dict(_FUSED_IN))
    stats["session_class"] = f"{onnxruntime.InferenceSession.__module__}.{onnxruntime.InferenceSession.__qualname__}"
    stats["stock_session_untouched"] = onnxruntime.InferenceSession is _STOCK_SESSION
    with open(_OUT, "a") as f:
        f.write(json.dumps({"stats": stats}) + "\\n")
'''


def _prepare_workdir(src_python: Path, src_testdata: Path, files: list[str], dest: Path) -> None:
    """Copy the selected tests, the folder's top-level modules and the testdata into ``dest``."""
    (dest / "python").mkdir(parents=True)
    for module in src_python.glob("*.py"):
        if module.name.startswith("onnxruntime_test_") and module.name not in files:
            continue  # other test files are not run; keep the work dir small and unambiguous
        shutil.copy2(module, dest / "python" / module.name)
    shutil.copytree(src_testdata, dest / "testdata", symlinks=True)


def _run(mode: str, workdir: Path, plugin_dir: Path, files: list[str], timeout: float) -> tuple[dict, dict, str]:
    """Run pytest in ``workdir``; return (outcome per row, plugin stats, pytest's last output line)."""
    out = workdir / "outcomes.jsonl"
    env = dict(os.environ, ORT_SUITE_MODE=mode, ORT_SUITE_OUT=str(out))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(plugin_dir), env.get("PYTHONPATH", "")) if p)
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-q", "-rN",
           "--rootdir", str(workdir), *(f"python/{f}" for f in files)]  # fmt: skip
    try:
        proc = subprocess.run(cmd, check=False, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
        tail = (proc.stdout.strip().splitlines() or [f"(no output, exit status {proc.returncode})"])[-1]
        if proc.returncode not in (0, 1):  # 0/1: tests ran; anything else: pytest itself failed, show why
            print(
                f"[{mode}] pytest exit status {proc.returncode}:",
                *(proc.stdout + proc.stderr).splitlines()[-20:],
                sep="\n  ",
            )
    except subprocess.TimeoutExpired:
        tail = f"(timed out after {timeout:.0f} s)"
    outcomes: dict[str, dict] = {}
    stats: dict = {}
    if out.exists():
        for line in out.read_text().splitlines():
            row = json.loads(line)
            if "stats" in row:
                stats = row["stats"]
            elif row["id"] not in outcomes or RANK[row["outcome"]] > RANK[outcomes[row["id"]]["outcome"]]:
                outcomes[row["id"]] = row  # a teardown error outranks the call's pass
    return outcomes, stats, tail


def _table(title: str, outcomes: dict[str, dict]) -> str:
    lines = [f"== {title}: {len(outcomes)} rows (outcome, test id [subtest], message) =="]
    for test_id in sorted(outcomes):
        row = outcomes[test_id]
        note = f"  ({row['message'].splitlines()[0][:100]})" if row["outcome"] != "passed" and row["message"] else ""
        lines.append(f"{row['outcome']:<8} {test_id}{note}")
    return "\n".join(lines)


def _totals(outcomes: dict[str, dict]) -> str:
    """E.g. "81 tests: 77 passed, 1 skipped, 3 failed; 22 subtests: 12 passed, 10 skipped"."""
    parts = []
    for noun, sub in (("tests", False), ("subtests", True)):
        rows = [r for r in outcomes.values() if r["subtest"] is sub]
        counts = sorted(collections.Counter(r["outcome"] for r in rows).items(), key=lambda kv: RANK[kv[0]])
        parts.append(f"{len(rows)} {noun}" + (": " + ", ".join(f"{n} {k}" for k, n in counts) if rows else ""))
    return "; ".join(parts)


def compare(stock: dict[str, dict], fused: dict[str, dict]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(all differing rows as (id, stock outcome, ortfuse outcome), ids where ortfuse is worse)."""
    diffs, worse = [], []
    for test_id in sorted(set(stock) | set(fused)):
        a = stock.get(test_id, {"outcome": "missing"})["outcome"]
        b = fused.get(test_id, {"outcome": "missing"})["outcome"]
        if a != b:
            diffs.append((test_id, a, b))
            if RANK[b] > RANK[a]:
                worse.append(test_id)
    return diffs, worse


def _patch_problems(stats: dict[str, dict]) -> list[str]:
    """Reasons to distrust the comparison: a run that did not finish, or a patch that did not apply."""
    problems = []
    for mode in MODES:
        if not stats[mode]:
            problems.append(f"the {mode} run did not finish (crash or timeout): no session summary")
    s, f = stats["stock"], stats["ortfuse"]
    if s and not s.get("stock_session_untouched"):
        problems.append(f"stock run used {s.get('session_class')} instead of onnxruntime's InferenceSession")
    if f:
        if f.get("stock_session_untouched") or not f.get("sessions_created"):
            problems.append("ortfuse run created no session through the patched onnxruntime.InferenceSession")
        if f.get("sessions_fusion_true", 0) != f.get("sessions_created", 0):
            problems.append("some patched sessions were created without fusion=True")
        if f.get("backend_reps_ortfuse_fusion_true", 0) != f.get("backend_reps", 0):
            problems.append("some onnxruntime.backend reps did not hold an ortfuse.InferenceSession(fusion=True)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ort-src", required=True, type=Path, help="ONNX Runtime source tree (or extract)")
    parser.add_argument("--files", nargs="+", default=list(DEFAULT_FILES), help="test files of onnxruntime/test/python")
    parser.add_argument("--workdir", type=Path, help="where to build the runs (default: a temp dir, removed after)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run (default 1800)")
    args = parser.parse_args(argv)

    src_python = args.ort_src / "onnxruntime" / "test" / "python"
    src_testdata = args.ort_src / "onnxruntime" / "test" / "testdata"
    files = [f for f in args.files if (src_python / f).is_file()]
    if not files or not src_testdata.is_dir():
        print(f"error: no test files among {args.files} in {src_python}, or no {src_testdata}", file=sys.stderr)
        return 2
    try:
        import ortfuse  # noqa: F401  (the ortfuse run needs it importable)
    except ImportError as exc:
        print(f"error: ortfuse is not importable ({exc}); run `pip install -e .` first", file=sys.stderr)
        return 2

    root = Path(tempfile.mkdtemp(prefix="ort_suite_")) if args.workdir is None else args.workdir
    root.mkdir(parents=True, exist_ok=True)
    try:
        plugin_dir = root / "plugin"
        plugin_dir.mkdir(exist_ok=True)
        (plugin_dir / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
        outcomes, stats = {}, {}
        for mode in MODES:
            workdir = root / mode
            if workdir.exists():
                shutil.rmtree(workdir)
            _prepare_workdir(src_python, src_testdata, files, workdir)
            start = time.perf_counter()
            outcomes[mode], stats[mode], tail = _run(mode, workdir, plugin_dir, files, args.timeout)
            print(f"[{mode}] {time.perf_counter() - start:.1f} s, pytest: {tail}")
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)

    for mode in MODES:
        print("\n" + _table(f"{mode} ORT" if mode == "stock" else "ortfuse (fusion=True)", outcomes[mode]))
    print(f"\nfiles: {', '.join(files)} from {args.ort_src}")
    for mode in MODES:
        print(f"{mode:>8}: {_totals(outcomes[mode])}")
    f = stats["ortfuse"]
    print(
        f"ortfuse run: {f.get('sessions_created', 0)} sessions through the patched InferenceSession "
        f"({f.get('sessions_fused', 0)} with a fusion applied), {f.get('backend_reps', 0)} ortfuse.backend reps"
    )
    for test_id, n in sorted(f.get("fused_in", {}).items()):
        print(f"  fused sessions in {test_id}: {n}")

    diffs, worse = compare(outcomes["stock"], outcomes["ortfuse"])
    print(f"\ndifferences: {len(diffs)}" + ("" if diffs else " (same outcome for every test)"))
    for test_id, a, b in diffs:
        message = outcomes["ortfuse"].get(test_id, {}).get("message", "")
        print(f"  {test_id}: stock {a}, ortfuse {b}{'  <- worse' if test_id in worse else ''}")
        if message:
            print(f"      {message.splitlines()[0][:200]}")
    problems = _patch_problems(stats)
    for problem in problems:
        print(f"error: {problem}")
    if worse:
        print(f"FAIL: ortfuse does worse than stock ORT on {len(worse)} tests")
    return 1 if worse or problems else 0


if __name__ == "__main__":
    sys.exit(main())
