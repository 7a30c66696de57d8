"""What ortfuse's session wrapper costs per run where its plan is stock ORT: a model whose run takes a
fraction of a millisecond (``auto_bench.tiny_ffn``, or ``--model``: a real one such as the public
``silero_vad``, with its first sample feed as ``tools/auto_bench.py`` makes them), run by stock ORT, by
a second stock session (the A/A control), by ``ortfuse.InferenceSession(fusion=False)`` and by a
``fusion="auto"`` session after its live tuning ended (its final plan printed: a session that keeps
nothing ends on "stock ORT"), and ORT's own ``run`` called on that auto session (the same C session
without ortfuse's ``run`` in between: their ratio is what the wrapper costs, free of the differences
between two sessions).

    python tools/wrapper_cost.py [--model tiny_ffn|silero_vad|...] [--block 400] [--rounds 60] [--threads 2]
                                 [--json benchmarks/results/]

Runs this short are timed in blocks: a block is ``--block`` back-to-back runs of one runner, timed
as a whole (the timer's and scheduler's noise spread over the block); the blocks of the five runners
are interleaved in the passes the timing protocol orders (``ortfuse.foundation.protocol``, Williams
orders), ``--rounds`` passes. Each session's per-run time is the median of its blocks; each
ratio is the median of the per-pass ratios, with their interquartile range. The A/A ratio is the
noise floor of the same run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import numpy as np  # noqa: E402

TUNED_S = 300.0


def _options(threads: int):
    import ortfuse

    so = ortfuse.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    return so


def sessions(path: str, threads: int, feeds: dict) -> tuple[dict, str]:
    """The four sessions, and the auto session's final status."""
    import onnxruntime as ort

    import ortfuse

    made = {"stock": ort.InferenceSession(path, _options(threads), providers=["CPUExecutionProvider"]),
            "stock_b": ort.InferenceSession(path, _options(threads), providers=["CPUExecutionProvider"]),
            "ortfuse_off": ortfuse.InferenceSession(path, _options(threads), fusion=False),
            "auto": ortfuse.InferenceSession(path, _options(threads), fusion="auto")}
    auto = made["auto"]
    start = time.perf_counter()
    while not auto.wait_tuned(0.005) and time.perf_counter() - start < TUNED_S:
        auto.run(None, feeds)  # served traffic with idle gaps: the tuning measures between runs
    return made, auto.fusion_status


def runners(made: dict) -> dict:
    """Each session's ``run``, and ORT's own ``InferenceSession.run`` called on the auto session
    (``auto_ort_run``: the same C session without ortfuse's ``run`` in between)."""
    from ortfuse.session import _ORT_RUN

    out = {name: session.run for name, session in made.items()}
    out["auto_ort_run"] = lambda output_names, feed: _ORT_RUN(made["auto"], output_names, feed)
    return out


def measure(runs: dict, feeds: dict, block: int, rounds: int) -> dict[str, list[float]]:
    """Per-run seconds of each runner's blocks, ``rounds`` passes in protocol order."""
    from ortfuse.foundation import protocol

    names = list(runs)
    for name in names:  # warm
        for _ in range(block // 4):
            runs[name](None, feeds)
    per: dict[str, list[float]] = {n: [] for n in names}
    for order in protocol.interleave(names, rounds):  # a block where the protocol puts a single run
        for name in order:
            run = runs[name]
            t0 = time.perf_counter()
            for _ in range(block):
                run(None, feeds)
            per[name].append((time.perf_counter() - t0) / block)
    return per


def summary(per: dict[str, list[float]]) -> dict:
    """Per name: median per-run time and the median of its per-pass ratios to stock ORT (and IQR);
    ``wrapper``: the auto session's ``run`` over ORT's ``run`` on the same session."""
    out = {"wrapper": _ratio(per["auto"], per["auto_ort_run"])}
    for name, times in per.items():
        out[name] = {"us_per_run": round(statistics.median(times) * 1e6, 3), **_ratio(times, per["stock"])}
    return out


def _ratio(times: list[float], base: list[float]) -> dict:
    ratios = [t / b for t, b in zip(times, base)]
    q = np.percentile(ratios, [25, 75])
    return {"ratio": round(statistics.median(ratios), 4), "ratio_iqr": [round(float(q[0]), 4), round(float(q[1]), 4)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="tiny_ffn",
                        help="tiny_ffn (built here), or a model tools/auto_bench.py takes (a public model's name...)")
    parser.add_argument("--json", default=None, metavar="DIR")
    args = parser.parse_args(argv)
    from auto_bench import TINY, label, machine_caches, model_and_feeds, tiny_ffn

    from ortfuse.bench.environment import environment

    with tempfile.TemporaryDirectory(prefix="ortfuse-wrapper-cost-") as folder:
        # nothing known, auto tunes; the kernels compiled on this machine before are found (auto_bench)
        os.environ.update(machine_caches())
        os.environ.setdefault("ORTFUSE_CACHE_DIR", os.path.join(folder, "cache"))
        if args.model == TINY:
            path = tiny_ffn(folder)
            import onnxruntime as ort

            first = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).get_inputs()[0]
            rng = np.random.default_rng(0)
            feeds = {first.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in first.shape])
                     .astype(np.float32)}
        else:
            path, samples = model_and_feeds(args.model)
            feeds = samples[0]
        made, status = sessions(path, args.threads, feeds)
        per = measure(runners(made), feeds, args.block, args.rounds)
    result = {"tool": "wrapper_cost", "model": args.model, "block": args.block, "rounds": args.rounds,
              "threads": args.threads,
              "auto_status": status, "environment": environment(), "summary": summary(per),
              "per_run_s": per}
    print(f"auto's final plan: {status}")
    for name, row in result["summary"].items():
        if name == "wrapper":
            continue
        print(f"{name:12s} {row['us_per_run']:9.3f} us/run  ratio to stock {row['ratio']:.4f} "
              f"[IQR {row['ratio_iqr'][0]:.4f}-{row['ratio_iqr'][1]:.4f}]")
    wrapper = result["summary"]["wrapper"]
    print(f"ortfuse's run over ORT's run on the same auto session: {wrapper['ratio']:.4f} "
          f"[IQR {wrapper['ratio_iqr'][0]:.4f}-{wrapper['ratio_iqr'][1]:.4f}]")
    if args.json:
        from ortfuse.bench.output import result_file

        named = "" if args.model == TINY else f"{label(args.model)}-"
        out = result_file(args.json, f"wrapper_cost-{named}{datetime.date.today().isoformat()}")  # -2, -3 when taken
        Path(out).write_text(json.dumps(result, indent=1))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
