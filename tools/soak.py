#!/usr/bin/env python
"""Soak test: many runs of one fused session with the process RSS sampled; is memory flat?

    python tools/soak.py                                   # 10,000 runs of fused bert_encoder
    python tools/soak.py --model mlp_gemm_relu_gelu --runs 2000 --batch 8 --every 100
    python tools/soak.py --kernels default                 # whatever fusion=True picks (may be lowered ORT ops)

Builds a fused session of a zoo model (``models.build``): with ``--kernels native`` (the default) or
``reference`` the model is rewritten by ``ortfuse.fuse(model, kernels=...)`` so that ortfuse's own
kernels run (fusion=True may pick kernels lowered to ORT ops, which would soak ORT, not ortfuse),
then loaded by ``ortfuse.InferenceSession``; ``--kernels default`` loads the model with fusion=True.
It checks that a fusion was applied, runs it ``--runs`` times on fixed inputs (the first output is compared
with the first run's every ``--every`` runs: a kernel that corrupts memory shows up here too), and
samples the RSS (psutil) every ``--every`` runs. After a warm-up (the first ``--warmup`` fraction of
the runs: arenas, caches and lazy allocations settle) it fits a line to the samples and prints the
samples, the slope (bytes per run), the growth the slope projects over the measured runs, and the
verdict: FLAT when that projected growth and the largest rise above the first post-warm-up sample
are both below ``--threshold-mib`` (default 8 MiB), else GROWING. Exit status 0 for FLAT.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import numpy as np


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def fit_slope(xs, ys) -> float:
    """Least-squares slope of ys over xs (0 for fewer than two points)."""
    if len(xs) < 2:
        return 0.0
    x = np.asarray(xs, np.float64)
    y = np.asarray(ys, np.float64)
    x = x - x.mean()
    denom = float((x * x).sum())
    return float((x * (y - y.mean())).sum() / denom) if denom else 0.0


def soak(session, feeds: dict, runs: int, every: int = 100, warmup: float = 0.1, threshold_mib: float = 8.0,
         progress: bool = True) -> dict:
    """Run ``session`` ``runs`` times; return the samples, fit and verdict (see the module docstring)."""
    from tqdm import tqdm

    first = session.run(None, feeds)[0]
    samples: list[tuple[int, int]] = [(0, rss())]
    mismatches = 0
    start = time.perf_counter()
    with tqdm(total=runs, unit="run", disable=not progress, mininterval=1, dynamic_ncols=True) as bar:
        for i in range(1, runs + 1):
            out = session.run(None, feeds)[0]
            if i % every == 0:
                if not np.array_equal(out, first, equal_nan=True):
                    mismatches += 1
                samples.append((i, rss()))
                bar.set_postfix(rss_mib=f"{samples[-1][1] / 2**20:.1f}")
            bar.update(1)
    seconds = time.perf_counter() - start
    cut = int(runs * warmup)
    measured = [(i, r) for i, r in samples if i >= cut]
    slope = fit_slope([i for i, _ in measured], [r for _, r in measured])
    window = measured[-1][0] - measured[0][0] if len(measured) > 1 else 0
    projected = slope * window
    rise = max(r for _, r in measured) - measured[0][1] if measured else 0
    limit = threshold_mib * 2**20
    verdict = "FLAT" if projected < limit and rise < limit and not mismatches else "GROWING"
    if mismatches:
        verdict = "OUTPUT CHANGED"
    return {"runs": runs, "seconds": seconds, "samples": samples, "warmup_runs": cut, "slope_bytes_per_run": slope,
            "projected_growth_bytes": projected, "max_rise_bytes": rise, "threshold_bytes": limit,
            "output_mismatches": mismatches, "verdict": verdict}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="bert_encoder", help="zoo model name (ortfuse models list)")
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--every", type=int, default=100, help="RSS sample interval in runs")
    p.add_argument("--warmup", type=float, default=0.1, help="fraction of runs before measuring")
    p.add_argument("--threshold-mib", type=float, default=8.0)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ORT's default)")
    p.add_argument("--kernels", choices=["native", "reference", "default"], default="native")
    args = p.parse_args(argv)

    import ortfuse
    from ortfuse import models
    from ortfuse.foundation.session_options import make_options

    path = str(models.build(args.model))
    so = make_options(threads=args.threads)
    if args.kernels == "default":
        session = ortfuse.InferenceSession(path, so, fusion=True)
    else:
        import onnx

        fused, _ = ortfuse.fuse(onnx.load(path), kernels=args.kernels)
        session = ortfuse.InferenceSession(fused, so)  # a rewritten model: run as is, our ops registered
    report = session.fusion_report
    if not report.applied:
        print(f"no fusion applied to {args.model}: {report.reason}", file=sys.stderr)
        return 2
    feeds = models.sample_inputs(args.model, batch=args.batch)
    gc.collect()
    print(f"{args.model} (batch {args.batch}): {len(report.fused)} fused ops "
          f"({', '.join(sorted({m.kernel for m in report.fused}))}); {args.runs} runs, RSS every {args.every}; "
          f"pid {os.getpid()}")
    result = soak(session, feeds, args.runs, args.every, args.warmup, args.threshold_mib)
    print("\nRSS samples (run: MiB):")
    line = []
    for i, r in result["samples"]:
        line.append(f"{i}:{r / 2**20:.1f}")
        if len(line) == 10:
            print("  " + "  ".join(line))
            line = []
    if line:
        print("  " + "  ".join(line))
    per_run_ms = 1000 * result["seconds"] / result["runs"]
    print(f"\n{result['runs']} runs in {result['seconds']:.1f} s ({per_run_ms:.2f} ms/run); "
          f"measured after {result['warmup_runs']} warm-up runs")
    print(f"slope {result['slope_bytes_per_run']:.1f} bytes/run; projected growth over the measured runs "
          f"{result['projected_growth_bytes'] / 2**20:.2f} MiB; "
          f"largest rise {result['max_rise_bytes'] / 2**20:.2f} MiB; "
          f"threshold {args.threshold_mib:.1f} MiB; output changes {result['output_mismatches']}")
    print(f"verdict: {result['verdict']}")
    return 0 if result["verdict"] == "FLAT" else 1


if __name__ == "__main__":
    sys.exit(main())
