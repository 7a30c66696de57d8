"""ortfuse and stock ORT behind the same Ray Serve deployment (``ortfuse serve``), same replicas, same load:
throughput and p50/p99 latency side by side, and the single-process ratios of the same models.

    python tools/fleet_bench.py            # crnn_recognizer and ppocr_mobile_v2_cls on 1 and 2 replicas
    python tools/fleet_bench.py --models crnn_recognizer --replicas 1,2,4 --repeats 5 --json benchmarks/results/

One local Ray instance (loopback). Per model and replica count, four applications of the same
deployment (``ortfuse.serve.deployment.application``, batching off so that a request is one run, as in
one process) are up at once: ``stock`` and ``stock_b`` (onnxruntime's own session: the A/A control),
``fused`` (``fusion=True``) and ``auto`` (``fusion="auto"`` on a fresh plan store; the bench waits for
its replicas to end their tuning before timing). Each replica reserves one CPU and runs one intra-op
thread; Ray is told of ``4 x replicas`` CPUs so that the four are up at once, and one is loaded at a
time. The load is a closed loop of ``2 x replicas`` clients, each sending its next request (.npz, the
model's sample input) when the previous one is answered: a block of ``--requests`` requests against one
application, the blocks of a repeat interleaved across the applications as the timing protocol orders
single runs (``ortfuse.foundation.protocol``: A B C D D C B A, Williams rounds), ``--repeats`` times.
Per application and repeat: p50 and p99 of the request latencies (client side), throughput (requests
answered over the blocks' wall time) and the p50 of the replicas' own run times (``x-ortfuse-run-ms``);
each ratio to ``stock`` is the median over repeats. Beside it, the single-process ratios of the same
sessions (one thread each, interleaved single runs, ``protocol.measure``), so the p50 ratio behind Ray
can be compared with the one in one process. The ortfuse sessions, behind Ray and in one process, are
told the requests' sizes (``ortfuse serve --dim``, ``served_dims``).

Writes ``fleet_bench-<models>-<date>.json`` (raw latencies, protocol, environment, summary) with
``--json DIR``, and prints the summary.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

CONFIGS = ("stock", "stock_b", "fused", "auto")  # stock_b: the A/A control
FUSION = {"stock": False, "stock_b": False, "fused": True, "auto": "auto"}
TUNED_S = 300.0  # the auto replicas' tuning, at most
ENDED = ("fused", "stock ORT")  # fusion_status once a tuning ended or a stored plan was installed
TIMEOUT_S = 120.0  # one request


def model_inputs(name: str) -> tuple[str, dict[str, np.ndarray]]:
    """The model's path and its seeded sample input at its natural size: a zoo or public model name."""
    from ortfuse import models
    from ortfuse.models import public

    if name in public.MODELS_TABLE:
        return str(public.fetch(name)), public.sample_inputs(name)
    return str(models.build(name)), models.sample_inputs(name, batch=1)


def served_dims(path: str, feeds: dict[str, np.ndarray]) -> str:
    """The sizes the requests have, by the names the model declares (``ortfuse serve --dim``): the
    ortfuse replicas are told them, as a deployment serving fixed sizes would be."""
    from ortfuse.ir.feeds import declared_inputs
    from ortfuse.layout.served_sizes import dims_of

    return dims_of(declared_inputs(path), {name: list(value.shape) for name, value in feeds.items()})


def npz(feeds: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **feeds)
    return buffer.getvalue()


def post(url: str, body: bytes) -> tuple[float, float]:
    """(latency ms, the replica's run ms) of one request; RuntimeError unless it is answered."""
    request = urllib.request.Request(url, body, {"Content-Type": "application/x-npz"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
        answer.read()
        run_ms = float(answer.headers.get("x-ortfuse-run-ms", "nan"))
    return (time.perf_counter() - start) * 1e3, run_ms


def block(url: str, body: bytes, requests: int, clients: int) -> dict:
    """A closed loop of ``clients`` clients sending ``requests`` requests in all."""
    per_client = [requests // clients + (i < requests % clients) for i in range(clients)]
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = list(pool.map(lambda n: [post(url, body) for _ in range(n)], per_client))
    wall = time.perf_counter() - start
    pairs = [p for client in done for p in client]
    return {"latency_ms": [p[0] for p in pairs], "run_ms": [p[1] for p in pairs], "wall_s": wall}


def statuses(url: str, replicas: int) -> dict[str, str]:
    """{replica: fusion status} of the replicas a few GETs reach (each GET reaches one)."""
    seen: dict[str, str] = {}
    for _ in range(4 * replicas):
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
            described = json.loads(answer.read())
        seen[described["replica"]] = described["fusion_status"]
    return seen


def fleet(path: str, feeds: dict, replicas: int, args, store: str) -> dict:
    """Deploy the four applications, warm them (and let auto tune), time the interleaved blocks."""
    from ray import serve

    from ortfuse.foundation import protocol
    from ortfuse.serve import deployment, startup

    urls = {}
    dims = served_dims(path, feeds)
    for name in CONFIGS:
        app = deployment.application(path, replicas=replicas, fusion=FUSION[name], plan_store=store, max_batch=1,
                                     dims=dims)  # stock replicas open onnxruntime's session: no entry
        urls[name] = startup.deploy(app, name, f"/{name}", port=args.port, local=True).url
    body, clients = npz(feeds), 2 * replicas
    tuned_by, seen = time.monotonic() + TUNED_S, {}
    while time.monotonic() < tuned_by:  # served requests are what auto tunes on; its tuning ends first
        block(urls["auto"], body, 4 * clients, clients)
        seen = statuses(urls["auto"], replicas)
        if len(seen) >= replicas and all(s.startswith(ENDED) for s in seen.values()):
            break
        time.sleep(1.0)
    for name in CONFIGS:  # warm-up
        block(urls[name], body, 2 * clients, clients)
    blocks: dict[str, list[list[dict]]] = {name: [] for name in CONFIGS}
    for _ in range(args.repeats):
        mine: dict[str, list[dict]] = {name: [] for name in CONFIGS}
        for order in protocol.interleave(CONFIGS, args.passes):
            for name in order:
                mine[name].append(block(urls[name], body, args.requests, clients))
        for name in CONFIGS:
            blocks[name].append(mine[name])
    for name in CONFIGS:
        serve.delete(name)
    return {"replicas": replicas, "clients": clients, "auto_status": sorted(seen.values()), "blocks": blocks,
            "summary": summarize(blocks)}


def summarize(blocks: dict[str, list[list[dict]]]) -> dict:
    """Per application: medians over repeats of p50, p99, throughput, run p50, and their ratios to stock."""
    from ortfuse.foundation.protocol import percentile

    per: dict[str, dict[str, list[float]]] = {}
    for name, repeats in blocks.items():
        rows = per.setdefault(name, {"p50_ms": [], "p99_ms": [], "rps": [], "run_p50_ms": []})
        for rep in repeats:
            lat = [x for b in rep for x in b["latency_ms"]]
            rows["p50_ms"].append(statistics.median(lat))
            rows["p99_ms"].append(percentile(lat, 99))
            rows["rps"].append(len(lat) / sum(b["wall_s"] for b in rep))
            rows["run_p50_ms"].append(statistics.median(x for b in rep for x in b["run_ms"]))
    out = {}
    for name, rows in per.items():
        ratios = {f"{key}_ratio": statistics.median(v / s for v, s in zip(rows[key], per["stock"][key]))
                  for key in rows}
        out[name] = {**{key: statistics.median(v) for key, v in rows.items()}, **ratios}
    return out


def single_process(path: str, feeds: dict, store: str, args) -> dict:
    """The same four sessions in this process, one thread each, interleaved single runs."""
    import onnxruntime

    import ortfuse
    from ortfuse.foundation import protocol
    from ortfuse.serve.replica import open_session

    os.environ["ORTFUSE_TUNE"] = "off"  # auto installs the plan its replicas published, measures nothing
    dims = served_dims(path, feeds)
    sessions = {name: open_session(path, FUSION[name], store, 1, dims) for name in CONFIGS}
    statuses = {name: getattr(s, "fusion_status", "stock ORT") for name, s in sessions.items()}
    assert isinstance(sessions["stock"], onnxruntime.InferenceSession)
    assert isinstance(sessions["fused"], ortfuse.InferenceSession)
    runners = {name: (lambda s=s: s.run(None, feeds)) for name, s in sessions.items()}
    latencies = protocol.measure(runners, runs=args.single_runs, repeats=args.repeats, warmup=3)
    return {"status": statuses, "latency_ms": latencies,
            "p50_ratio": {name: protocol.ratio(latencies[name], latencies["stock"]) for name in CONFIGS}}


def environment() -> dict:
    import subprocess

    import onnxruntime
    import ray

    from ortfuse._version import __version__ as ortfuse_version
    from ortfuse.foundation import isa

    with open("/proc/cpuinfo") as info:
        cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cpu": cpu,
            "cores": os.cpu_count(), "cpu_fingerprint": isa.fingerprint(), "load_avg": os.getloadavg(),
            "versions": {"ortfuse": ortfuse_version, "onnxruntime": onnxruntime.__version__, "ray": ray.__version__},
            "commit": subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                                     text=True, check=False).stdout.strip() or None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="crnn_recognizer,ppocr_mobile_v2_cls")
    parser.add_argument("--replicas", default="1,2", help="comma list of replica counts")
    parser.add_argument("--requests", type=int, default=24, help="requests per block")
    parser.add_argument("--passes", type=int, default=2, help="blocks per application per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--single-runs", type=int, default=40, help="single-process runs per repeat")
    parser.add_argument("--port", type=int, default=8787)
    parser.add_argument("--json", default=None, metavar="DIR", help="write the result file into DIR")
    args = parser.parse_args(argv)
    replica_counts = [int(r) for r in args.replicas.split(",")]
    names = args.models.split(",")

    from ortfuse.serve import startup

    startup.connect(None, object_store_mb=256, num_cpus=max(replica_counts) * len(CONFIGS))
    result = {"tool": "fleet_bench", "environment": environment(), "protocol": {
        "configs": CONFIGS, "requests_per_block": args.requests, "passes": args.passes, "repeats": args.repeats,
        "clients": "2 x replicas, closed loop", "batching": "off (max_batch 1)", "threads_per_replica": 1,
        "single_process": {"runs": args.single_runs, "repeats": args.repeats, "threads": 1}}, "models": {}}
    try:
        for name in names:
            path, feeds = model_inputs(name)
            store = tempfile.mkdtemp(prefix="fleet-bench-store-")
            entry: dict = {"path": path, "inputs": {k: list(v.shape) for k, v in feeds.items()}, "fleet": []}
            for replicas in replica_counts:
                entry["fleet"].append(fleet(path, feeds, replicas, args, store))
                print_fleet(name, entry["fleet"][-1])
            entry["single_process"] = single_process(path, feeds, store, args)
            print(f"{name} single process p50 ratio to stock: " + ", ".join(
                f"{c} {r:.3f}" for c, r in entry["single_process"]["p50_ratio"].items()), flush=True)
            result["models"][name] = entry
    finally:
        from ray import serve

        serve.shutdown()
        import ray

        ray.shutdown()
    result["environment"]["load_avg_after"] = os.getloadavg()
    if args.json:
        from ortfuse.bench.output import result_file

        target = result_file(args.json, f"fleet_bench-{'+'.join(names)}-{datetime.date.today().isoformat()}")
        Path(target).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {target}")
    return 0


def print_fleet(name: str, run: dict) -> None:
    print(f"{name}, {run['replicas']} replica(s), {run['clients']} clients; auto: {run['auto_status']}")
    print(f"  {'config':8} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'run p50':>8}   ratios to stock: p50 p99 req/s "
          "run-p50")
    for config, row in run["summary"].items():
        print(f"  {config:8} {row['rps']:8.1f} {row['p50_ms']:8.2f} {row['p99_ms']:8.2f} {row['run_p50_ms']:8.2f}"
              f"   {row['p50_ms_ratio']:.3f} {row['p99_ms_ratio']:.3f} {row['rps_ratio']:.3f} "
              f"{row['run_p50_ms_ratio']:.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
