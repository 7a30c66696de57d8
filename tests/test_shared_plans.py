"""Replicas sharing a plan store (``ortfuse.runtime.shared_plans``), as real processes, each with a
cache of its own (other machines) and one store folder: the model is tuned once; a replica started
after publication serves fused from its first request; a lease whose holder was killed (SIGKILL)
expires and another replica takes it and tunes.

Each replica states its timings as tests/test_live_tuning.py's ``winning`` fixture does (every
fusion twice as fast as ORT) and tunes in its tuning thread (``live_tuning.IN_CHILD = False``: a
tuning process would not carry the stated timings); it counts the measuring ``tuner.tune`` calls
and compares every served output with stock ORT at ORT_DISABLE_ALL within 1e-4.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import onnx
import pytest

import ortfuse
from ortfuse.runtime import shared_plans

from model_fixtures import ffn_matmul_add_relu

TESTS = str(Path(__file__).parent)
WAIT_S = 120  # generous: the machine is shared; a healthy tuning here takes a few seconds

REPLICA = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import onnxruntime
    from timing_fixtures import raw_timing
    from model_fixtures import ffn_inputs
    from ortfuse.runtime import live_tuning
    from ortfuse.tune import measure, tuner
    measure._best_of = lambda f, o, n: (0.5, 1.0)
    measure._time_pair = lambda f, o, budget: (0.5, 1.0, [0.5] * measure.REPEATS)
    measure._time_with_control = lambda f, o, c, budget: raw_timing(0.5, 1.0)
    live_tuning.IN_CHILD = False
    tunings, real = [], tuner.tune
    def counting(*args, **kwargs):
        if kwargs.get("measure"):
            tunings.append(1)
        return real(*args, **kwargs)
    tuner.tune = counting
    import ortfuse
    path, runs, wait_s, hold = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "hold"
    session = ortfuse.InferenceSession(path, fusion="auto")
    first = session.fusion_report.applied
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    stock = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    deadline, n, error = time.time() + wait_s, 0, 0.0
    while n < runs or (not hold and not session.fusion_report.applied and time.time() < deadline):
        feeds = ffn_inputs(batch=2, seq=5, seed=n)
        for got, want in zip(session.run(None, feeds), stock.run(None, feeds)):
            error = max(error, float(np.max(np.abs(got - want))))
        n += 1
        time.sleep(0.02)
    print(json.dumps({"first": first, "applied": session.fusion_report.applied, "tunings": len(tunings),
                      "error": error, "runs": n, "status": session.fusion_status,
                      "notes": session.fusion_report.notes}), flush=True)
    if hold:
        time.sleep(600)
""")


def _start(model: str, store: Path, cache: Path, runs: int = 3, hold: bool = False, lease_s: float = 60.0):
    env = {**os.environ, "ORTFUSE_CACHE_DIR": str(cache), shared_plans.STORE_ENV: str(store),
           shared_plans.LEASE_ENV: str(lease_s)}
    return subprocess.Popen([sys.executable, "-c", REPLICA, TESTS, model, str(runs), str(WAIT_S),
                             "hold" if hold else "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _result(process) -> dict:
    out, err = process.communicate(timeout=WAIT_S + 60)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _model(tmp_path: Path) -> str:
    path = tmp_path / "ffn.onnx"
    onnx.save(ffn_matmul_add_relu(), str(path))
    return str(path)


def test_replicas_tune_once_and_a_later_one_serves_fused_from_its_first_request(tmp_path):
    model, store = _model(tmp_path), tmp_path / "store"
    replicas = [_start(model, store, tmp_path / f"cache{i}") for i in range(2)]
    results = [_result(p) for p in replicas]
    assert sum(r["tunings"] for r in results) == 1, results
    assert all(r["applied"] and not r["first"] and r["error"] <= 1e-4 for r in results), results
    assert len(list(store.glob("*.plan"))) == 1 and not list(store.glob("*.lease"))
    late = _result(_start(model, store, tmp_path / "cache_late"))
    assert late["first"] and late["tunings"] == 0 and late["error"] <= 1e-4, late


def test_a_lease_whose_holder_was_killed_expires_and_another_replica_tunes(tmp_path):
    model, store, lease_s = _model(tmp_path), tmp_path / "store", 2.0
    holder = _start(model, store, tmp_path / "cache_holder", runs=3, hold=True, lease_s=lease_s)
    try:
        assert holder.stdout is not None
        held = json.loads(holder.stdout.readline())  # 3 runs served: recording, the lease taken, no tuning yet
        assert not held["applied"] and held["tunings"] == 0, held
        deadline = time.monotonic() + 30
        while not list(store.glob("*.lease")) and time.monotonic() < deadline:  # taken by its store thread
            time.sleep(0.05)
        leases = list(store.glob("*.lease"))
        assert len(leases) == 1 and json.loads(leases[0].read_text())["pid"] == holder.pid
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        started = time.monotonic()
        other = _result(_start(model, store, tmp_path / "cache_other", lease_s=lease_s))
        assert other["applied"] and other["tunings"] == 1 and other["error"] <= 1e-4, other
        assert time.monotonic() - started < WAIT_S
        assert len(list(store.glob("*.plan"))) == 1
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_a_store_folder_that_cannot_be_made_is_one_warning_and_the_session_tunes_here(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(shared_plans.STORE_ENV, str(tmp_path / "file" / "store"))
    with pytest.warns(UserWarning, match="plan store not used: its folder cannot be made"):
        session = ortfuse.InferenceSession(_model(tmp_path), fusion="auto")
    assert session.fusion_status.startswith("serving stock ORT, recording feeds")
