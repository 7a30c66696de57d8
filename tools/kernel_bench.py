"""Time the elementwise numba kernels against the same subgraph run unfused by stock onnxruntime.

Usage::

    python tools/kernel_bench.py [--large N] [--small N] [--kernels relu,gelu,...] [--runs R]
                                 [--repeats K] [--gap-ms G] [--no-spin] [--json PATH]
    python tools/kernel_bench.py --threshold [--kernels relu,gelu,silu,add_relu]

For each kernel and size, three configurations run in the same process, single calls interleaved
(``A B C C B A``, rotated; DESIGN.md §6b, ``ortfuse.bench_measure``), ``--repeats`` times:

- ``ort``: the unfused subgraph (e.g. HardSwish as Add->Clip->Div->Mul) in an ORT session at
  ORT_ENABLE_ALL (ORT's own fusions apply: erf-Gelu becomes its Gelu kernel), run through IO binding
  into a preallocated output (no output allocation, little Python overhead);
- ``ort_aa``: a second, identical ORT session (the A/A control: the noise floor of this very run);
- ``fused``: the numba kernel of ``ortfuse.custom_ops.kernels.eltwise`` on contiguous float32 arrays
  with a preallocated output, called through its numba dispatcher (a few microseconds of call overhead,
  which a cfunc inside ORT does not pay), serial unless ``--parallel-min`` says otherwise.

Reported: median latency of each, ``fused/ort`` and ``ort_aa/ort`` (median over repeats of the ratio of
per-repeat medians), and the fused kernel's bandwidth in GB/s (bytes of all inputs and the output,
like STREAM, no write-allocate traffic) against a STREAM-like copy measured here (the best of a
serial numba copy loop, a prange one and numpy's copy, same size). The load average before and after
is printed: on a shared machine other processes change everything (DESIGN.md §6b).

``--threshold`` measures the serial kernel against the prange one over sizes from 16K to 4M elements
(``parallel_min`` huge vs 0), the data behind ``eltwise.PARALLEL_MIN``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from ortfuse.custom_ops.kernels import eltwise as E

from ortfuse.bench_measure import measure, ratio

F32 = np.float32
BCAST_N = 1024  # the last dim of the broadcast cases


# ---------------------------------------------------------------------------------------------
# the unfused subgraphs
# ---------------------------------------------------------------------------------------------

def _const(name, value):
    return numpy_helper.from_array(np.asarray(value, dtype=F32), name)


def _model(nodes, inputs, inits, opset=17):
    graph = helper.make_graph(
        nodes, "bench",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, inputs[0][1])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def build(kernel: str, n: int, pm: int = E.PARALLEL_MIN):
    """(ONNX model, {input: array}, fused callable(out), bytes moved) for ``kernel`` on n elements,
    the fused kernel called with ``parallel_min=pm``."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n) * 3).astype(F32)
    mn = n // BCAST_N
    if kernel == "relu":
        model = _model([helper.make_node("Relu", ["X"], ["Y"])], [("X", [n])], [])
        feeds = {"X": x}
        fn = lambda out: E.relu(x, out, pm)
    elif kernel == "clip":
        model = _model([helper.make_node("Clip", ["X", "lo", "hi"], ["Y"])], [("X", [n])],
                       [_const("lo", 0.0), _const("hi", 6.0)])
        feeds = {"X": x}
        fn = lambda out: E.clip(x, out, F32(0), F32(6), pm)
    elif kernel == "add_relu":
        b = (rng.standard_normal(n) * 3).astype(F32)
        model = _model([helper.make_node("Add", ["A", "B"], ["S"]), helper.make_node("Relu", ["S"], ["Y"])],
                       [("A", [n]), ("B", [n])], [])
        feeds = {"A": x, "B": b}
        fn = lambda out: E.add_relu(x, b, out, pm)
    elif kernel == "add_relu_bcast":
        b = (rng.standard_normal(BCAST_N) * 3).astype(F32)
        model = _model([helper.make_node("Add", ["A", "B"], ["S"]), helper.make_node("Relu", ["S"], ["Y"])],
                       [("A", [mn, BCAST_N]), ("B", [BCAST_N])], [])
        feeds = {"A": x.reshape(mn, BCAST_N), "B": b}
        fn = lambda out: E.add_relu_bcast(x, b, out, pm)
    elif kernel == "hardswish":
        model = _model([helper.make_node("Add", ["X", "three"], ["a"]),
                        helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
                        helper.make_node("Div", ["c", "six"], ["d"]),
                        helper.make_node("Mul", ["X", "d"], ["Y"])],
                       [("X", [n])], [_const("three", 3.0), _const("zero", 0.0), _const("six", 6.0)])
        feeds = {"X": x}
        fn = lambda out: E.hardswish(x, out, F32(3), F32(0), F32(6), F32(6), pm)
    elif kernel == "silu":
        model = _model([helper.make_node("Sigmoid", ["X"], ["s"]), helper.make_node("Mul", ["X", "s"], ["Y"])],
                       [("X", [n])], [])
        feeds = {"X": x}
        fn = lambda out: E.silu(x, out, pm)
    elif kernel == "gelu":
        model = _model([helper.make_node("Div", ["X", "sqrt2"], ["d"]),
                        helper.make_node("Erf", ["d"], ["e"]),
                        helper.make_node("Add", ["e", "one"], ["p"]),
                        helper.make_node("Mul", ["X", "p"], ["m"]),
                        helper.make_node("Mul", ["m", "half"], ["Y"])],
                       [("X", [n])], [_const("sqrt2", np.sqrt(2.0)), _const("one", 1.0), _const("half", 0.5)])
        feeds = {"X": x}
        fn = lambda out: E.gelu(x, out, pm)
    elif kernel == "gelu_tanh":
        model = _model([helper.make_node("Mul", ["X", "X"], ["x2"]),
                        helper.make_node("Mul", ["x2", "X"], ["x3"]),
                        helper.make_node("Mul", ["x3", "k"], ["kx3"]),
                        helper.make_node("Add", ["X", "kx3"], ["s"]),
                        helper.make_node("Mul", ["s", "c"], ["u"]),
                        helper.make_node("Tanh", ["u"], ["t"]),
                        helper.make_node("Add", ["t", "one"], ["p"]),
                        helper.make_node("Mul", ["X", "p"], ["m"]),
                        helper.make_node("Mul", ["m", "half"], ["Y"])],
                       [("X", [n])], [_const("k", 0.044715), _const("c", np.sqrt(2.0 / np.pi)),
                                      _const("one", 1.0), _const("half", 0.5)])
        feeds = {"X": x}
        fn = lambda out: E.gelu_tanh(x, out, pm)
    elif kernel == "bias_gelu":
        b = (rng.standard_normal(BCAST_N) * 0.1).astype(F32)
        model = _model([helper.make_node("Add", ["X", "B"], ["xb"]),
                        helper.make_node("Div", ["xb", "sqrt2"], ["d"]),
                        helper.make_node("Erf", ["d"], ["e"]),
                        helper.make_node("Add", ["e", "one"], ["p"]),
                        helper.make_node("Mul", ["xb", "p"], ["m"]),
                        helper.make_node("Mul", ["m", "half"], ["Y"])],
                       [("X", [mn, BCAST_N]), ("B", [BCAST_N])],
                       [_const("sqrt2", np.sqrt(2.0)), _const("one", 1.0), _const("half", 0.5)])
        feeds = {"X": x.reshape(mn, BCAST_N), "B": b}
        code = E.encode_activation("gelu")
        fn = lambda out: E.bias_act(x, b, out, code, F32(0), F32(0), pm)
    else:
        raise KeyError(kernel)
    nbytes = 4 * (sum(v.size for v in feeds.values()) + n)
    return model, feeds, fn, nbytes


KERNELS = ["relu", "clip", "add_relu", "add_relu_bcast", "hardswish", "silu", "gelu", "gelu_tanh", "bias_gelu"]


def ort_runner(model, feeds, out: np.ndarray, spin: bool):
    """Run ``model`` by IO binding into ``out`` (viewed with the shape of the first input)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    binding = sess.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    shape = list(next(iter(feeds.values())).shape)
    binding.bind_output("Y", "cpu", 0, np.float32, shape, out.ctypes.data)
    return lambda: sess.run_with_iobinding(binding)


# ---------------------------------------------------------------------------------------------
# copy bandwidth
# ---------------------------------------------------------------------------------------------

@numba.njit(nogil=True, parallel=True, cache=True)
def _par_copy(src, dst):
    for i in numba.prange(src.size):
        dst[i] = src[i]


@numba.njit(nogil=True, cache=True)
def _copy(src, dst):
    for i in range(src.size):
        dst[i] = src[i]


def copy_bandwidth(n: int, reps: int = 15) -> dict:
    """STREAM-like copy: GB/s = 2 * 4 * n bytes / time (median of reps) of a serial numba loop, a
    prange one and numpy's copyto; ``best`` is the highest."""
    src = np.random.default_rng(1).standard_normal(n).astype(F32)
    dst = np.empty_like(src)
    _par_copy(src, dst)
    _copy(src, dst)
    res = {}
    for name, fn in (("numba", lambda: _copy(src, dst)), ("numba_prange", lambda: _par_copy(src, dst)),
                     ("numpy", lambda: np.copyto(dst, src))):
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            fn()
            ts.append((time.perf_counter_ns() - t0) / 1e9)
        res[name] = 8 * n / statistics.median(ts) / 1e9
    res["best"] = max(res.values())
    return res


# ---------------------------------------------------------------------------------------------
# the comparison
# ---------------------------------------------------------------------------------------------

def bench_kernel(kernel: str, n: int, args, copy_gbs: float) -> dict:
    model, feeds, fn, nbytes = build(kernel, n, args.parallel_min)
    outs = {k: np.empty(n, F32) for k in ("ort", "ort_aa", "fused")}
    runners = {
        "ort": ort_runner(model, feeds, outs["ort"], not args.no_spin),
        "ort_aa": ort_runner(model, feeds, outs["ort_aa"], not args.no_spin),
        "fused": lambda: fn(outs["fused"]),
    }
    for r in runners.values():  # compile / first-run
        r()
    status = fn(outs["fused"])
    assert status == E.OK, status
    diff = float(np.nanmax(np.abs(outs["fused"] - outs["ort"]) / (1e-6 + np.abs(outs["ort"])))) if n else 0.0
    lat = measure(runners, runs=args.runs, repeats=args.repeats, warmup=2, gap_s=args.gap_ms / 1000)
    med = {k: statistics.median(statistics.median(rep) for rep in v) for k, v in lat.items()}
    fused_gbs = nbytes / (med["fused"] / 1000) / 1e9
    return {
        "kernel": kernel, "n": n, "ort_ms": med["ort"], "fused_ms": med["fused"], "ort_aa_ms": med["ort_aa"],
        "fused_over_ort": ratio(lat["fused"], lat["ort"]), "aa_control": ratio(lat["ort_aa"], lat["ort"]),
        "fused_gbs": fused_gbs, "ort_gbs": nbytes / (med["ort"] / 1000) / 1e9,
        "copy_gbs": copy_gbs, "fused_pct_copy": 100 * fused_gbs / copy_gbs, "max_rel_diff_vs_ort": diff,
    }


def threshold_table(kernels, sizes, args) -> list[dict]:
    rows = []
    for kernel in kernels:
        for n in sizes:
            x = np.random.default_rng(2).standard_normal(n).astype(F32)
            b = x[::-1].copy()
            out = np.empty(n, F32)
            if kernel == "add_relu":
                def run(pm, x=x, b=b, out=out):
                    return lambda: E.add_relu(x, b, out, pm)
            else:
                def run(pm, k=E.UNARY_KERNELS[kernel], x=x, out=out):
                    return lambda: k(x, out, pm)
            runners = {"serial": run(E.SERIAL), "parallel": run(0)}
            for r in runners.values():
                r()
            lat = measure(runners, runs=args.runs, repeats=args.repeats, warmup=2)
            med = {k2: statistics.median(statistics.median(rep) for rep in v) for k2, v in lat.items()}
            rows.append({"kernel": kernel, "n": n, "serial_us": med["serial"] * 1000,
                         "parallel_us": med["parallel"] * 1000,
                         "parallel_over_serial": ratio(lat["parallel"], lat["serial"])})
            print(f"{kernel:10s} {n:>9d}  serial {rows[-1]['serial_us']:9.1f} us  parallel "
                  f"{rows[-1]['parallel_us']:9.1f} us  parallel/serial {rows[-1]['parallel_over_serial']:.2f}",
                  flush=True)
    return rows


def _fmt_n(n: int) -> str:
    return f"{n // (1 << 20)}M" if n % (1 << 20) == 0 else f"{n // 1024}K" if n % 1024 == 0 else str(n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--large", type=int, default=1 << 24, help="elements of the large tensor (default 16M)")
    ap.add_argument("--small", type=int, default=1 << 16, help="elements of the small tensor (default 64K)")
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--runs", type=int, default=20, help="timed passes per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gap-ms", type=float, default=0.0, help="idle sleep before every single run")
    ap.add_argument("--no-spin", action="store_true", help="ORT sessions with intra-op spinning off")
    ap.add_argument("--parallel-min", type=int, default=E.PARALLEL_MIN,
                    help="parallel_min passed to the kernels (default: eltwise.PARALLEL_MIN, serial)")
    ap.add_argument("--threshold", action="store_true", help="serial vs prange over sizes instead")
    ap.add_argument("--json", help="also write the rows as JSON to this path")
    args = ap.parse_args(argv)
    kernels = [k for k in args.kernels.split(",") if k]

    env = {"numba": numba.__version__, "onnxruntime": ort.__version__, "numpy": np.__version__,
           "numba_threads": numba.get_num_threads(), "threading_layer": None, "cpus": os.cpu_count(),
           "parallel_min": args.parallel_min, "loadavg_before": os.getloadavg()}
    if args.threshold:
        sizes = [1 << k for k in range(14, 23)]
        rows = threshold_table([k for k in kernels if k in E.UNARY_KERNELS or k == "add_relu"], sizes, args)
        env["threading_layer"] = numba.threading_layer()
        result = {"env": env, "threshold": rows}
    else:
        rows = []
        copy = {}
        for n in (args.small, args.large):
            copy[n] = copy_bandwidth(n)
            for kernel in kernels:
                rows.append(bench_kernel(kernel, n, args, copy[n]["best"]))
                r = rows[-1]
                print(f"  {kernel:15s} {_fmt_n(n):>5s}  ort {r['ort_ms']:8.3f} ms  fused {r['fused_ms']:8.3f} ms  "
                      f"fused/ort {r['fused_over_ort']:.2f}  A/A {r['aa_control']:.2f}", file=sys.stderr, flush=True)
        env["threading_layer"] = numba.threading_layer()
        env["loadavg_after"] = os.getloadavg()
        result = {"env": env, "copy_gbs": {str(k): v for k, v in copy.items()}, "rows": rows}
        pm = "serial" if args.parallel_min >= E.SERIAL else f"parallel from {args.parallel_min}"
        print(f"numba {env['numba']} ({env['threading_layer']}, {env['numba_threads']} threads, kernels {pm}), "
              f"onnxruntime {env['onnxruntime']} ORT_ENABLE_ALL{' spinning off' if args.no_spin else ''}, "
              f"{args.repeats} repeats x {args.runs} interleaved runs, gap {args.gap_ms} ms; load average "
              f"{env['loadavg_before'][0]:.2f} before, {env['loadavg_after'][0]:.2f} after")
        for n, c in copy.items():
            print(f"copy bandwidth {_fmt_n(n)} floats: numba {c['numba']:.1f} GB/s, numba prange "
                  f"{c['numba_prange']:.1f} GB/s, numpy {c['numpy']:.1f} GB/s")
        print()
        print("| kernel | n | ORT unfused ms | fused ms | fused/ORT | A/A | fused GB/s | % of copy |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['kernel']} | {_fmt_n(r['n'])} | {r['ort_ms']:.3f} | {r['fused_ms']:.3f} | "
                  f"{r['fused_over_ort']:.2f} | {r['aa_control']:.2f} | {r['fused_gbs']:.1f} | {r['fused_pct_copy']:.0f}% |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
