"""Time a 4-op elementwise chain: ortfuse's native FusedEltwiseChain vs stock ORT at ORT_ENABLE_ALL.

    python tools/chain_bench.py [--chain tanh|relu] [--sizes 16777216 65536] [--runs 15] [--repeats 5]

Chain: Y = act(X * 1.702 + b) * 0.5, b of the last dim (1024), act = Tanh or Relu. Protocol of
``ortfuse.foundation.protocol`` (docs/ARCHITECTURE.md §8): single runs interleaved (A B B A,
Williams-rotated for three configurations), a median per repeat, the ratio the median over repeats;
``ort_control`` is a second stock session, the A/A noise floor of the same run. The stock sessions
run at ORT_ENABLE_ALL, every session with ORT's threads and spinning.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import ortfuse
from ortfuse.foundation.protocol import measure, p50_per_repeat, ratio
from ortfuse.foundation.session_options import make_options

WIDTH = 1024


def chain_model(act: str) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(1.702, np.float32), "scale"),
             numpy_helper.from_array(np.linspace(-1, 1, WIDTH, dtype=np.float32), "bias"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [helper.make_node("Mul", ["X", "scale"], ["t0"], name="mul"),
             helper.make_node("Add", ["t0", "bias"], ["t1"], name="add"),
             helper.make_node(act, ["t1"], ["t2"], name=act.lower()),
             helper.make_node("Mul", ["t2", "half"], ["Y"], name="mul_half")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", WIDTH])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", WIDTH])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chain", choices=["tanh", "relu"], default="tanh")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << 24, 1 << 16], help="elements of X")
    ap.add_argument("--runs", type=int, default=0, help="timed runs per repeat (0: by size)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    data = chain_model(args.chain.capitalize()).SerializeToString()
    so = make_options("ORT_ENABLE_ALL")
    stock_a = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    stock_b = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    fused = ortfuse.InferenceSession(data, providers=["CPUExecutionProvider"], fusion=True,
                                     fusion_patterns=["eltwise_chain"])
    print("fusion:", [(m.nodes, m.kernel) for m in fused.fusion_report.matches])
    print(f"load average before: {os.getloadavg()}")
    for n in args.sizes:
        x = np.random.default_rng(0).uniform(-3, 3, (n // WIDTH, WIDTH)).astype(np.float32)
        feed = {"X": x}
        np.testing.assert_allclose(fused.run(None, feed)[0], stock_a.run(None, feed)[0], rtol=2e-5, atol=2e-6)
        runs = args.runs or (15 if n >= 1 << 22 else 200)
        sessions = {"ort": stock_a, "fused": fused, "ort_control": stock_b}
        lat = measure({k: functools.partial(sess.run, None, feed) for k, sess in sessions.items()},
                      runs=runs, repeats=args.repeats)
        p50 = {k: statistics.median(p50_per_repeat(v)) for k, v in lat.items()}
        print(f"n={n}: p50 ms ort {p50['ort']:.3f}  fused {p50['fused']:.3f}  ort_control {p50['ort_control']:.3f} | "
              f"fused/ort {ratio(lat['fused'], lat['ort']):.3f}  A/A ort_control/ort "
              f"{ratio(lat['ort_control'], lat['ort']):.3f}  ({runs} runs x {args.repeats} repeats)")
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
