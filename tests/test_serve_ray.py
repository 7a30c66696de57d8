"""``ortfuse serve`` on a real local Ray instance (loopback only), as a user runs it: the command in a
process of its own, two ``fusion="auto"`` replicas of the zoo's crnn_recognizer sharing one plan
store, and HTTP clients on 127.0.0.1.

- The replicas tune once between them, publish the plan, and both end fused.
- Under a bounded open-loop load one model replica's process is killed (SIGKILL), then the other
  original replica (``ray.kill`` from a driver that joins the instance): every answer is stock ORT's
  for its own input (ORT_DISABLE_ALL, max abs error within ``TOL``: probabilities, fused kernels sum
  in another order), every request that is not answered gets a retriable 5xx, Serve starts
  replacements, which serve fused from their first request without tuning (one tuning in all, one
  plan file, no lease left).
- A second ``ortfuse serve`` joins the instance with ``--address`` after the plan is published: its
  replica serves fused from its first request, and stopping it leaves the first application serving.

Each replica has a cache of its own and stated timings (tests/serve_replica_setup.py). Bounded in
time: the command stops by itself after ``LIFETIME_S`` (``--duration``), every request times out,
and the module's fixture stops the command (SIGINT, then SIGKILL) whatever happens; Ray's processes
share the fate of the command that started them. One Ray instance for the module, in one xdist
worker (``xdist_group``; pyproject's ``--dist loadgroup``).
"""

from __future__ import annotations

import io
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from ortfuse import models

from serve_replica_setup import SERVE_DIR

pytestmark = [pytest.mark.xdist_group("ray_serve"), pytest.mark.slow]

TESTS = str(Path(__file__).parent)
MODEL = "crnn_recognizer"  # a small CNN (PP-OCR-style recognizer): input [batch, 3, 48, width]
TOL = 1e-4
LIFETIME_S = 420  # the command's --duration: it stops by itself even if this process dies
START_S = 240  # command start to ready (Ray's start and two replicas on a shared 2-core machine)
REQUEST_S = 60  # one HTTP request
INTERVAL_S = 0.04  # the client sends a request every INTERVAL_S (open loop), from at most THREADS threads
THREADS = 64
KILL_AT = 40  # requests sent when a model replica's process is killed
LOAD = 120  # requests at least, and until the replacements answered
REPLACEMENT_ANSWERS = 3  # answers of each replacement, at least
LOAD_S = 150  # the load's bound in time
MAX_REQUESTS = 3000  # and in count (the time bound comes first)
# each request waits up to this long in its replica for others to batch with: requests of equal shapes run
# as one batch, and the replicas killed under load hold requests
BATCH_WAIT_MS = 200
MAX_BATCH = 16
# Ray's worker_process_setup_hook travels in this variable, which each worker reads at start
# (ray/_private/workers/default_worker.py); the runtime_env field itself is turned into it only in a
# job's runtime_env (ray.init), not in an actor's, where Serve puts the replicas' one
SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
AUTH_MODE_ENV = "RAY_AUTH_MODE"
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # ortfuse.serve.startup sets it in a process it runs in
DRIVER_S = 120  # one answer of the driver process


@dataclass
class Answer:
    shape: tuple
    status: int  # 0: no HTTP answer at all (connection error)
    error: float = 0.0  # max abs difference from stock ORT
    replica: str = ""
    request: int = 0
    fused: bool = False
    batch: int = 0
    attempts: int = 0  # sends of the request to a model replica (the ingress sends again when one dies)
    body: dict = field(default_factory=dict)  # the error body


class Command:
    """``ortfuse serve`` in a process of its own, its output read until ``ready:``."""

    def __init__(self, args: list[str], log: Path, env: dict | None = None) -> None:
        self.log = log.open("w")
        self.process = subprocess.Popen([sys.executable, "-m", "ortfuse", "serve", *args], stdout=subprocess.PIPE,
                                        stderr=self.log, text=True, start_new_session=True,
                                        env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if line.startswith("ready: "):
                self.ready.set()
        self.ready.set()  # ended: wait() below reports it

    def wait_ready(self) -> str:
        self.ready.wait(START_S)
        ready = [line for line in self.lines if line.startswith("ready: ")]
        tail = Path(self.log.name).read_text()[-3000:]
        assert ready, f"ortfuse serve did not start: {self.lines}; its stderr ends: {tail}"
        return ready[0].split(" ", 1)[1]

    def value(self, prefix: str) -> str:
        return next(line.split(prefix, 1)[1].split()[0] for line in self.lines if prefix in line)

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)
        self.log.close()
        return self.process.returncode


@dataclass
class Fleet:
    url: str
    cluster: str
    model: str
    store: Path
    serve_dir: Path
    runtime_env: str
    port: int
    warmup: list[Answer]


def _inputs(index: int) -> np.ndarray:
    """Request ``index``'s input: batch 1 or 2, width 32 or 48 (two batch groups), seeded."""
    shape = (1 + index % 2, 3, 48, 32 if index % 3 else 48)
    return np.random.default_rng(index).standard_normal(shape, dtype=np.float32)


class Client:
    def __init__(self, url: str, model: str) -> None:
        self.url = url
        so = onnxruntime.SessionOptions()
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = 1
        self.stock = onnxruntime.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        self.lock = threading.Lock()

    def post(self, index: int) -> Answer:
        x = _inputs(index)
        if index % 2:  # JSON for half the requests, .npz for the others
            body = json.dumps({"inputs": {"input": {"dtype": "float32", "shape": list(x.shape),
                                                    "data": x.ravel().tolist()}}}).encode()
            kind = "application/json"
        else:
            buffer = io.BytesIO()
            np.savez(buffer, input=x)
            body, kind = buffer.getvalue(), "application/x-npz"
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": kind})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_S) as answer:
                data, headers, status = answer.read(), answer.headers, answer.status
        except urllib.error.HTTPError as exc:
            return Answer(x.shape, exc.code, body=json.loads(exc.read() or b"{}"))
        except OSError:
            return Answer(x.shape, 0)
        if kind == "application/json":
            out = json.loads(data)["outputs"]["output"]
            got = np.array(out["data"], np.float32).reshape(out["shape"])
        else:  # np.load reads each member's header with ast.literal_eval, which CPython 3.11 can fail in two
            # threads at once (SystemError: AST constructor recursion depth mismatch): one answer at a time
            with self.lock, np.load(io.BytesIO(data), allow_pickle=False) as npz:
                got = npz["output"]
        with self.lock:
            want = self.stock.run(None, {"input": x})[0]
        error = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf")
        return Answer(x.shape, status, error, headers["x-ortfuse-replica"], int(headers["x-ortfuse-request"]),
                      headers["x-ortfuse-fused"] == "true", int(headers["x-ortfuse-batch"]),
                      int(headers["x-ortfuse-attempts"]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tunings(fleet: Fleet) -> list[str]:
    path = fleet.serve_dir / "tunings"
    return path.read_text().split() if path.exists() else []


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The command serving 2 replicas, warmed up until the plan is published and both answer fused."""
    base = tmp_path_factory.mktemp("fleet")
    model = base / "crnn.onnx"
    shutil.copyfile(models.build(MODEL), model)
    store, serve_dir = base / "store", base / "replicas"
    serve_dir.mkdir()
    runtime_env = json.dumps({"env_vars": {"PYTHONPATH": TESTS, SERVE_DIR: str(serve_dir),
                                           SETUP_HOOK_ENV: "serve_replica_setup.stated_timings"}})
    port = _free_port()
    command = Command([str(model), "--replicas", "2", "--port", str(port), "--plan-store", str(store),
                       "--runtime-env-json", runtime_env, "--duration", str(LIFETIME_S), "--object-store-mb", "128",
                       "--num-cpus", "4", "--batch-wait-ms", str(BATCH_WAIT_MS), "--max-batch", str(MAX_BATCH)],
                      base / "serve.log")
    try:
        url = command.wait_ready()
        fleet = Fleet(url, command.value("Ray cluster: "), str(model), store, serve_dir, runtime_env, port, [])
        client, deadline, index = Client(url, str(model)), time.monotonic() + 150, 0
        with ThreadPoolExecutor(4) as pool:
            while time.monotonic() < deadline:
                fleet.warmup += pool.map(client.post, range(index, index + 4))
                index += 4
                fused = {a.replica for a in fleet.warmup if a.fused}
                if len(fused) == 2 and list(store.glob("*.plan")):
                    break
                time.sleep(0.2)
        yield fleet
    finally:
        code = command.stop()
        print(f"ortfuse serve exited with {code}; its output: {command.lines}")


DRIVER = textwrap.dedent("""
    import json, os, sys
    os.environ["RAY_AUTH_MODE"] = "token"
    from ortfuse.serve import startup
    startup.connect(sys.argv[1])
    import ray
    print(json.dumps("joined"), flush=True)
    for line in sys.stdin:
        command, _, name = line.strip().partition(" ")
        if command == "kill":
            ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
            print(json.dumps("killed"), flush=True)
        else:
            named = [n["name"] for n in ray.util.list_named_actors(all_namespaces=True)]
            print(json.dumps({n.rsplit("#", 1)[1]: n for n in named
                              if n.startswith("SERVE_REPLICA::") and "#model#" in n}), flush=True)
    ray.shutdown()
""")


class Driver:
    """A Ray driver joined to the running instance, in a process of its own (this process may have imported
    Ray already, which would then take this machine's network address, not loopback): lists the model
    replicas ({replica id: actor name}) and kills one with ``ray.kill``. The instance runs with Ray's token
    authentication (its default for a local instance), which a driver given an address uses only when
    told to (RAY_AUTH_MODE=token; the token is the one the instance wrote in this user's ~/.ray)."""

    def __init__(self, cluster: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != LOOPBACK_ENV}
        self.process = subprocess.Popen([sys.executable, "-c", DRIVER, cluster], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self._answer() == "joined"

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put("null")

    def _answer(self):
        try:
            return json.loads(self.lines.get(timeout=DRIVER_S))
        except queue.Empty:
            raise AssertionError(f"the driver did not answer in {DRIVER_S} s") from None

    def _send(self, line: str):
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self._answer()

    def replicas(self) -> dict[str, str]:
        return self._send("list")

    def kill(self, name: str) -> None:
        assert self._send(f"kill {name}") == "killed"

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(DRIVER_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)


def _live_replica_pids(fleet: Fleet) -> list[int]:
    """Process ids of the model replicas alive now (each made its cache folder, cache-<pid>)."""
    pids = [int(p.name.split("-", 1)[1]) for p in fleet.serve_dir.glob("cache-*")]
    return sorted(pid for pid in pids if os.path.exists(f"/proc/{pid}"))


def test_replicas_tune_once_and_replicas_killed_under_load_lose_no_answer(fleet):
    """Two deaths under an open-loop load: one replica's process crashes (SIGKILL), then, once its
    replacement answered, the other original replica is killed with ``ray.kill``. A request a dead
    replica held is sent again (the ingress, or Serve's router before it) or refused with a retriable
    5xx: the counts are printed; tests/test_serve_codec.py checks the ingress's resending itself."""
    warm = fleet.warmup
    assert {a.status for a in warm} == {200} and max(a.error for a in warm) <= TOL, warm
    assert len({a.replica for a in warm if a.fused}) == 2, "both replicas fused after the warm-up"
    assert len(list(fleet.store.glob("*.plan"))) == 1 and len(_tunings(fleet)) == 1

    driver = Driver(fleet.cluster)
    try:
        before = driver.replicas()
        pids = _live_replica_pids(fleet)
        assert len(before) == 2 and len(pids) == 2, (before, pids)
        client, futures, crashed, killed = Client(fleet.url, fleet.model), [], 0, ""
        deadline = time.monotonic() + LOAD_S
        with ThreadPoolExecutor(THREADS) as pool:  # open loop: one request every INTERVAL_S, answered or not
            while len(futures) < MAX_REQUESTS and time.monotonic() < deadline:
                answered = [f.result() for f in futures if f.done()]
                new = {a.replica for a in answered if a.replica and a.replica not in before}
                if len(futures) >= LOAD and len(new) == 2 and sum(a.replica in new for a in answered) >= \
                        2 * REPLACEMENT_ANSWERS:
                    break
                futures.append(pool.submit(client.post, len(futures)))
                if len(futures) == KILL_AT:
                    crashed = pids[0]
                    os.kill(crashed, signal.SIGKILL)
                if crashed and not killed and new:  # the first replacement answers: kill the other original
                    survivors = set(before) & set(driver.replicas())
                    if len(survivors) == 1:
                        killed = survivors.pop()
                        driver.kill(before[killed])
                time.sleep(INTERVAL_S)
            answers = [f.result() for f in futures]
        after = driver.replicas()
    finally:
        driver.close()

    wrong = [a for a in answers if a.status == 200 and not a.error <= TOL]
    failed = [a for a in answers if a.status != 200]
    resent = sum(a.attempts > 1 for a in answers)
    print(f"{len(answers)} requests, {len(failed)} failed, {resent} sent again, "
          f"batches {sorted({a.batch for a in answers})}, replicas before {sorted(before)} after {sorted(after)}")
    assert crashed and killed and not set(before) & set(after) and len(after) == 2, (before, after)
    assert wrong == [], "answered wrongly"
    assert all(a.status >= 500 and a.body.get("retriable") is True and a.body.get("error") for a in failed), failed
    for replica in after:
        served = [a for a in answers if a.replica == replica]
        assert len(served) >= 1 and [a.fused for a in served if a.request == 1] == [True], \
            ("each replacement serves fused from its first request", replica, served[:3])
    assert len(_tunings(fleet)) == 1, "one tuning in all: the replacements did not tune again"
    assert len(list(fleet.store.glob("*.plan"))) == 1 and not list(fleet.store.glob("*.lease"))
    assert max(a.batch for a in answers) > 1, "concurrent requests of equal shapes ran as one batch"


def test_a_replica_joining_after_publication_serves_fused_from_its_first_request(fleet, tmp_path):
    command = Command([fleet.model, "--replicas", "1", "--address", fleet.cluster, "--name", "late",
                       "--route-prefix", "/late", "--plan-store", str(fleet.store), "--runtime-env-json",
                       fleet.runtime_env, "--duration", "150"], tmp_path / "late.log",
                      {AUTH_MODE_ENV: "token"})
    try:
        url = command.wait_ready()
        assert url == f"http://127.0.0.1:{fleet.port}/late", url
        client = Client(url, fleet.model)
        answers = [client.post(i) for i in range(3)]
    finally:
        code = command.stop()
    assert code == 0, command.lines
    assert [a.status for a in answers] == [200, 200, 200] and max(a.error for a in answers) <= TOL, answers
    assert answers[0].request == 1 and all(a.fused for a in answers), answers
    assert len(_tunings(fleet)) == 1 and len(list(fleet.store.glob("*.plan"))) == 1
    still = Client(fleet.url, fleet.model).post(7)  # the first application serves on: the cluster was left as it was
    assert still.status == 200 and still.error <= TOL
