"""GFLOP/s of the AMX bf16 GEMM (FusedGemmActBf16) against stock ORT (MLAS float32) on one
MatMul + Add + Relu subgraph at ORT_ENABLE_ALL (ORT fuses it into Gemm/FusedGemm itself).

Configurations per shape and thread count: ``ort`` (stock), ``ort_control`` (a second stock session:
the A/A noise floor of the same run) and ``amx`` (ortfuse with ``ortfuse.precision=bf16``; its
report must name the AMX kernel). Single runs interleaved with ``ortfuse.foundation.protocol.measure``
(A B C C B A and Williams-rotated rounds), intra-op spinning off for all, ``--repeats`` repeats,
medians (docs/ARCHITECTURE.md §8). ``--json PATH`` writes the raw latencies, protocol, environment
(load average before and after) and the table's rows, by convention to
``benchmarks/results/amx_bench-<shapes>-<date>.json``. Needs a CPU with AMX.

    python tools/amx_bench.py [--shapes 1x1024x1024,64x4096x4096] [--threads 1,2] [--runs 15] [--repeats 5]
                              [--json benchmarks/results/amx_bench-64x4096x4096-<date>.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import ortfuse
from ortfuse.bench.environment import environment, load_average
from ortfuse.foundation.files import write_atomic
from ortfuse.foundation.protocol import measure, p50_per_repeat, ratio

WARMUP = 3
DEFAULT_SHAPES = "1x1024x1024,64x1024x1024,1x4096x4096,64x4096x4096,64x512x1024,1024x1024x1024"


def gemm_relu(m: int, k: int, n: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["X", "W"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "B"], ["h"], name="bias"),
             helper.make_node("Relu", ["h"], ["Y"], name="relu")]
    graph = helper.make_graph(nodes, "gemm_relu", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _options(threads: int, bf16: bool) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if bf16:
        so.add_session_config_entry("ortfuse.precision", "bf16")
    return so


def bench(m: int, k: int, n: int, threads: int, runs: int, repeats: int) -> dict:
    model = gemm_relu(m, k, n).SerializeToString()
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    stock = ort.InferenceSession(model, _options(threads, False), providers=["CPUExecutionProvider"])
    control = ort.InferenceSession(model, _options(threads, False), providers=["CPUExecutionProvider"])
    amx = ortfuse.InferenceSession(model, _options(threads, True), fusion=True, fusion_patterns=["gemm_act"])
    kernels = [r.kernel for r in amx.fusion_report.matches]
    if kernels != ["native numba amx (bf16 products)"]:
        raise SystemExit(f"the AMX kernel was not selected: {kernels} ({amx.fusion_report.reason})")
    feeds = {"X": x}
    y_amx, y_ort = amx.run(None, feeds)[0], stock.run(None, feeds)[0]
    rel = float(np.max(np.abs(y_amx - y_ort)) / max(1e-30, float(np.max(np.abs(y_ort)))))
    runners = {"ort": lambda: stock.run(None, feeds), "ort_control": lambda: control.run(None, feeds),
               "amx": lambda: amx.run(None, feeds)}
    lat = measure(runners, runs=runs, repeats=repeats, warmup=WARMUP)
    flop = 2.0 * m * k * n
    p50 = {name: statistics.median(p50_per_repeat(v)) for name, v in lat.items()}
    return {"shape": f"{m}x{k}x{n}", "threads": threads,
            "ort_ms": p50["ort"], "amx_ms": p50["amx"],
            "ort_gflops": flop / p50["ort"] / 1e6, "amx_gflops": flop / p50["amx"] / 1e6,
            "amx_over_ort": ratio(lat["amx"], lat["ort"]), "control": ratio(lat["ort_control"], lat["ort"]),
            "max_rel_diff": rel, "latencies_ms": lat}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma list of MxKxN")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", metavar="PATH", help="write the raw results as JSON to PATH")
    args = ap.parse_args(argv)
    load_before = load_average()
    print(f"load average before: {load_before}")
    rows = []
    print(f"{'shape':>16} {'thr':>3} {'ORT ms':>9} {'AMX ms':>9} {'ORT GF/s':>9} {'AMX GF/s':>9} "
          f"{'AMX/ORT':>8} {'A/A':>6} {'max|d|/max|y|':>13}")
    for threads in (int(t) for t in args.threads.split(",")):
        for shape in args.shapes.split(","):
            m, k, n = (int(v) for v in shape.split("x"))
            r = bench(m, k, n, threads, args.runs, args.repeats)
            rows.append(r)
            print(f"{r['shape']:>16} {threads:>3} {r['ort_ms']:>9.3f} {r['amx_ms']:>9.3f} {r['ort_gflops']:>9.1f} "
                  f"{r['amx_gflops']:>9.1f} {r['amx_over_ort']:>8.3f} {r['control']:>6.3f} {r['max_rel_diff']:>13.2e}",
                  flush=True)
    load_after = load_average()
    print(f"load average after: {load_after}")
    if args.json:
        env = {**environment(), "load_average_before": load_before, "load_average_after": load_after}
        doc = {"tool": "amx_bench", "argv": argv if argv is not None else sys.argv[1:],
               "protocol": {"runs": args.runs, "repeats": args.repeats, "warmup": WARMUP, "spinning": "off",
                            "graph_optimization_level": "ORT_ENABLE_ALL"},
               "environment": env, "results": rows}
        write_atomic(args.json, json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
