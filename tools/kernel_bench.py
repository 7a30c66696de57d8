"""Time the fused kernels against the same subgraph run unfused by stock onnxruntime.

Usage::

    python tools/kernel_bench.py [--large N] [--small N] [--threads 1,2] [--cases hardswish,...]
                                 [--gemm none,relu,...] [--fused-threading serial,numba] [--runs R]
                                 [--repeats K] [--gap-ms G] [--no-spin] [--json PATH]
    python tools/kernel_bench.py --dispatcher [--kernels relu,gelu,...] [--parallel-min N] ...
    python tools/kernel_bench.py --threshold [--kernels relu,gelu,silu,add_relu]

Main table (default): the native custom ops as users run them. For each case, size and intra-op
thread count, three ORT sessions run in the same process with the same thread count, each by IO
binding into a preallocated output, single runs interleaved (docs/ARCHITECTURE.md §8,
``ortfuse.foundation.protocol``: Williams-rotated ``A B C C B A`` rounds), ``--repeats`` times:

- ``ort``: the unfused subgraph (HardSwish as Add->Clip->Div->Mul, SiLU as Sigmoid->Mul, MatMul+Add
  +activation, ...) at ORT_ENABLE_ALL (ORT's own fusions apply);
- ``ort_aa``: a second, identical stock session (the A/A control: the noise floor of this very run);
- ``fused``: a one-node model holding the fused op (made by ``ortfuse.fusion.rewrite.fuse(..., kernels=
  "native")`` from the unfused graph, or built directly for FusedGemmAct), its native kernel
  registered with ``registration.register_native``, threading as ``native.set_threading`` says.

Cases: FusedHardSwish, FusedSiLU, FusedAddRelu (equal shapes and a [M, 1024] + [1024] broadcast),
FusedEltwiseChain<k> (two 3-op chains; only when a native chain kernel is registered in this
process), the float16 kernels (``*_f16``: the same subgraphs on float16 tensors against ORT's
float16 ops), FusedGemmAct with each epilogue (none, relu, gelu, gelu_tanh, silu) at a small and a
BERT-FFN-sized shape. Reported: median latencies, ``fused/ort`` and ``ort_aa/ort`` (median over
repeats of the ratio of per-repeat medians), and the fused op's rate against a peak measured in the
same run at the same thread count: GB/s (bytes of all inputs and the output, like STREAM, no
write-allocate traffic) against copies of that size timed in the same interleaved rounds as the
case: ORT's Identity and numpy's copyto (both memcpy, which switches to non-temporal stores above
a size threshold: no read-for-ownership of the output lines), a numba loop with plain stores
(serial at 1 thread, prange at more; STREAM's Copy as compilers build it) and a numba loop with
non-temporal stores (``copy_loops.py``). Two columns: % of the best of them, and % of the plain-store loop. GFLOP/s
against ORT's 1024^3 MatMul timed before the GEMM cases. The load average is printed before and
after: on a shared machine other processes change everything.

``--fused-threading serial,numba``: the same fused session also timed (same rounds) with those
``native.set_threading`` modes, read by the kernels at run time (a second table).

``--dispatcher``: the numba kernels of ``kernels/eltwise.py`` through their numba dispatcher (a few
microseconds of call overhead a cfunc inside ORT does not pay) against the unfused ORT subgraph;
``--threshold``: serial against prange over sizes from 16K to 4M elements, the data behind
``eltwise.PARALLEL_MIN``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "tools"):  # run from a checkout without installing; copy_loops beside this file
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ortfuse.custom_ops.native import threads as native_threads
from ortfuse.custom_ops.numba_setup import configure_numba
from ortfuse.custom_ops.registration import native_op_table, native_unavailable_reason, register_native
from ortfuse.foundation.protocol import measure, ratio

configure_numba()  # before kernels.eltwise is imported: it starts numba's threads
from ortfuse.custom_ops.kernels import eltwise as E
from ortfuse.custom_ops.specs import DOMAIN
from ortfuse.foundation.session_options import make_options

from bench_graphs import _const, _model, act_nodes
from copy_loops import _copy, _nt_copy, _par_copy, _par_nt_copy, copy_bandwidth

F32 = np.float32
BCAST_N = 1024  # the last dim of the broadcast cases


# ---------------------------------------------------------------------------------------------
# the unfused subgraphs (the activations as exporters write them: bench_graphs.py)
# ---------------------------------------------------------------------------------------------

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
    elif kernel in ("silu", "gelu", "gelu_tanh"):
        nodes, inits = act_nodes(kernel, "X", "Y")
        model = _model(nodes, [("X", [n])], inits)
        feeds = {"X": x}
        fn = lambda out: E.UNARY_KERNELS[kernel](x, out, pm)
    elif kernel == "bias_gelu":
        b = (rng.standard_normal(BCAST_N) * 0.1).astype(F32)
        nodes, inits = act_nodes("gelu", "xb", "Y")
        model = _model([helper.make_node("Add", ["X", "B"], ["xb"]), *nodes],
                       [("X", [mn, BCAST_N]), ("B", [BCAST_N])], inits)
        feeds = {"X": x.reshape(mn, BCAST_N), "B": b}
        code = E.encode_activation("gelu")
        fn = lambda out: E.bias_act(x, b, out, code, F32(0), F32(0), pm)
    else:
        raise KeyError(kernel)
    nbytes = 4 * (sum(v.size for v in feeds.values()) + n)
    return model, feeds, fn, nbytes


KERNELS = ["relu", "clip", "add_relu", "add_relu_bcast", "hardswish", "silu", "gelu", "gelu_tanh", "bias_gelu"]


def session(model, spin: bool, threads: int = 0, native_op: str = ""):
    """An ORT session at ORT_ENABLE_ALL with ``threads`` intra-op threads (0: ORT's default); with
    ``native_op`` that op's native kernel is registered first (``registration.register_native``)."""
    so = make_options("ORT_ENABLE_ALL", threads=threads, spinning=spin)
    if native_op and not register_native(so, [native_op]):
        raise RuntimeError(f"native {native_op} unavailable: {native_unavailable_reason([native_op])}")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def bound(sess, feeds, out: np.ndarray):
    """A callable running ``sess`` by IO binding: inputs ``feeds``, output 0 written into ``out``."""
    binding = sess.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    binding.bind_output(sess.get_outputs()[0].name, "cpu", 0, out.dtype.type, list(out.shape), out.ctypes.data)
    return lambda: sess.run_with_iobinding(binding)


def ort_runner(model, feeds, out: np.ndarray, spin: bool, threads: int = 0, native_op: str = ""):
    """Run ``model`` by IO binding into ``out`` (the shape of the model's output)."""
    return bound(session(model, spin, threads, native_op), feeds, out)


# ---------------------------------------------------------------------------------------------
# the comparison
# ---------------------------------------------------------------------------------------------

def bench_kernel(kernel: str, n: int, args, copy_gbs: float) -> dict:
    model, feeds, fn, nbytes = build(kernel, n, args.parallel_min)
    outs = {k: np.empty(n, F32) for k in ("ort", "ort_aa", "fused")}
    feeds_shape = next(iter(feeds.values())).shape
    runners = {
        "ort": ort_runner(model, feeds, outs["ort"].reshape(feeds_shape), not args.no_spin),
        "ort_aa": ort_runner(model, feeds, outs["ort_aa"].reshape(feeds_shape), not args.no_spin),
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


# ---------------------------------------------------------------------------------------------
# native mode: the fused custom ops as users run them, in ORT sessions
# ---------------------------------------------------------------------------------------------

# case -> (pattern id, fused op type or its prefix); the fused model is ``fuse(unfused, [pattern],
# kernels="native")``, which must come out as one node of that op
ELTWISE_CASES = {
    "hardswish": ("hardswish", "FusedHardSwish"),
    "silu": ("silu", "FusedSiLU"),
    "mish": ("mish", "FusedMish"),
    "add_relu": ("add_relu", "FusedAddRelu"),
    "add_relu_bcast": ("add_relu", "FusedAddRelu"),
    "chain_affine_relu": ("eltwise_chain", "FusedEltwiseChain"),
    "chain_bias_tanh": ("eltwise_chain", "FusedEltwiseChain"),
    "hardswish_f16": ("hardswish", "FusedHardSwish"),    # float16 tensors: FusedHardSwishF16
    "silu_f16": ("silu", "FusedSiLU"),
    "mish_f16": ("mish", "FusedMish"),
    "add_relu_f16": ("add_relu", "FusedAddRelu"),
}
GEMM_SHAPES = {"small": (16, 256, 256), "large": (128, 768, 3072)}  # M, K, N
GEMM_ACTS = ("", "relu", "gelu", "gelu_tanh", "silu")
MATMUL_PEAK_DIM = 1024


def to_float16(model, feeds: dict):
    """The same model and feeds in float16 (inputs, output, initializers)."""
    for i, t in enumerate(model.graph.initializer):
        if t.data_type == TensorProto.FLOAT:
            half = numpy_helper.to_array(t).astype(np.float16)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(half, t.name))
    for vi in [*model.graph.input, *model.graph.output]:
        vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    onnx.checker.check_model(model)
    return model, {k: v.astype(np.float16) for k, v in feeds.items()}


def unfused_eltwise(case: str, n: int):
    """(unfused model, feeds, bytes moved: inputs + output) of an elementwise case on n elements."""
    if case.endswith("_f16"):
        model, feeds, nbytes = unfused_eltwise(case[:-4], n)
        return (*to_float16(model, feeds), nbytes // 2)
    if case in ("chain_affine_relu", "chain_bias_tanh"):
        x = (np.random.default_rng(0).standard_normal(n) * 3).astype(F32)
        mk = helper.make_node
        if case == "chain_affine_relu":  # relu(1.5 x + 0.25): 3 ops, 2 scalar operands
            model = _model([mk("Mul", ["X", "a"], ["m"]), mk("Add", ["m", "b"], ["s"]), mk("Relu", ["s"], ["Y"])],
                           [("X", [n])], [_const("a", 1.5), _const("b", 0.25)])
            feeds = {"X": x}
        else:  # 0.5 tanh(x + bias[1024]): 3 ops, a broadcast operand and a scalar
            bias = (np.random.default_rng(1).standard_normal(BCAST_N) * 0.1).astype(F32)
            model = _model([mk("Add", ["X", "bias"], ["s"]), mk("Tanh", ["s"], ["t"]), mk("Mul", ["t", "half"], ["Y"])],
                           [("X", [n // BCAST_N, BCAST_N])], [_const("bias", bias), _const("half", 0.5)])
            feeds = {"X": x.reshape(n // BCAST_N, BCAST_N)}
        return model, feeds, 8 * n
    if case == "mish":  # x * tanh(softplus(x)) as exporters write it: 3 ops
        mk = helper.make_node
        model = _model([mk("Softplus", ["X"], ["p"]), mk("Tanh", ["p"], ["t"]), mk("Mul", ["X", "t"], ["Y"])],
                       [("X", [n])], [])
        return model, {"X": (np.random.default_rng(0).standard_normal(n) * 3).astype(F32)}, 8 * n
    model, feeds, _fn, nbytes = build(case, n)
    return model, feeds, nbytes


def fused_by_rewrite(model, pattern: str, op_prefix: str):
    """(fused model, op type) from ortfuse's rewriter with native kernels, or (None, why not)."""
    from ortfuse.fusion.rewrite import fuse

    fused, report = fuse(model, [pattern], kernels="native")
    nodes = list(fused.graph.node)
    if len(nodes) != 1 or nodes[0].domain != DOMAIN or not nodes[0].op_type.startswith(op_prefix):
        why = "; ".join(f"{m.decision}: {m.reason}" for m in report.matches) or report.reason
        return None, f"not fused into one native {op_prefix} node ({why})"
    return fused, nodes[0].op_type


def gemm_models(m: int, k: int, n: int, act: str):
    """(unfused MatMul+Add[+activation], fused FusedGemmAct node, feeds, FLOPs of the GEMM)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(F32)
    b = (rng.standard_normal(n) * 0.1).astype(F32)
    inits = [_const("W", w), _const("B", b)]
    nodes, act_inits = act_nodes(act, "z", "Y")
    unfused = _model([helper.make_node("MatMul", ["X", "W"], ["mm"]), helper.make_node("Add", ["mm", "B"], ["z"]),
                      *nodes], [("X", [m, k])], inits + act_inits, out_shape=[m, n])
    attrs = {"activation": act} if act else {}
    fused = _model([helper.make_node("FusedGemmAct", ["X", "W", "B"], ["Y"], domain=DOMAIN, **attrs)],
                   [("X", [m, k])], inits, out_shape=[m, n], domains=(DOMAIN,))
    feeds = {"X": rng.standard_normal((m, k)).astype(F32)}
    return unfused, fused, feeds, 2 * m * k * n


def _medians(lat: dict) -> dict:
    return {k: statistics.median(statistics.median(rep) for rep in v) for k, v in lat.items()}


def copy_runners(n: int, threads: int, args) -> dict:
    """STREAM-like copies of n floats at ``threads`` (name -> callable), timed beside each case:
    ORT's Identity by IO binding (intra-op threads = threads), numpy's copyto (one thread), a numba
    loop (serial at one thread, else prange on numba's threads: ``numba.set_num_threads(threads)``,
    set by the caller) and a serial numba loop with non-temporal stores (``_nt_copy``; plus a prange
    one above one thread)."""
    src = np.random.default_rng(1).standard_normal(n).astype(F32)
    dst = {k: np.empty_like(src) for k in ("ort_identity", "numpy", "numba", "numba_nt")}
    nodes, _ = act_nodes("", "X", "Y")
    plain = _copy if threads == 1 else _par_copy
    nt_addr = dst["numba_nt"].ctypes.data
    runners = {"copy_ort_identity": ort_runner(_model(nodes, [("X", [n])], []), {"X": src}, dst["ort_identity"],
                                               not args.no_spin, threads),
               "copy_numpy": lambda: np.copyto(dst["numpy"], src),
               "copy_numba": lambda: plain(src, dst["numba"]),
               "copy_numba_nt": lambda: _nt_copy(src, dst["numba_nt"], nt_addr)}
    if threads > 1:  # numba's prange stalls for a scheduler tick when the other core is busy: keep the serial one too
        runners["copy_numba_nt_prange"] = lambda: _par_nt_copy(src, dst["numba_nt"], nt_addr)
    return runners


def matmul_peak(threads: int, args, dim: int = MATMUL_PEAK_DIM) -> float:
    """GFLOP/s of ORT's MatMul [dim, dim] x [dim, dim] (weight constant) at ``threads`` intra-op threads."""
    rng = np.random.default_rng(3)
    model = _model([helper.make_node("MatMul", ["X", "W"], ["Y"])], [("X", [dim, dim])],
                   [_const("W", rng.standard_normal((dim, dim)))])
    out = np.empty((dim, dim), F32)
    run = ort_runner(model, {"X": rng.standard_normal((dim, dim)).astype(F32)}, out, not args.no_spin, threads)
    med = _medians(measure({"matmul": run}, runs=max(5, args.runs // 2), repeats=3, warmup=2))
    return 2 * dim ** 3 / (med["matmul"] / 1000) / 1e9


def compare_native(unfused, fused, op_type: str, feeds, out_shape, threads: int, args, extra=None) -> dict:
    """Stock ORT on ``unfused`` (and its A/A copy) against ORT running ``fused`` with the native
    ``op_type``, interleaved single runs (``ortfuse.foundation.protocol.measure``) with the ``extra`` runners
    (copies) in the same rounds; latencies in ms (``extra_ms``: the extra runners' medians)."""
    dtype = next(iter(feeds.values())).dtype  # float32, or float16 for the _f16 cases
    outs = {k: np.empty(out_shape, dtype) for k in ("ort", "ort_aa", "fused")}
    spin = not args.no_spin
    fused_run = ort_runner(fused, feeds, outs["fused"], spin, threads, op_type)
    runners = {"ort": ort_runner(unfused, feeds, outs["ort"], spin, threads),
               "ort_aa": ort_runner(unfused, feeds, outs["ort_aa"], spin, threads)}
    default_mode = native_threads.threading_settings()[0]
    runners["fused"] = _threaded(fused_run, default_mode) if args.fused_threading else fused_run
    for mode in args.fused_threading:  # the mode is read at run time: one session serves every mode
        if mode != default_mode:
            runners[f"fused[{mode}]"] = _threaded(fused_run, mode)
    runners.update(extra or {})
    for r in runners.values():
        r()
    ref = outs["ort"]
    fused_out, ref = outs["fused"].astype(np.float64), ref.astype(np.float64)
    diff = float(np.nanmax(np.abs(fused_out - ref) / (1e-3 + np.abs(ref)))) if ref.size else 0.0
    lat = measure(runners, runs=args.runs, repeats=args.repeats, warmup=2, gap_s=args.gap_ms / 1000)
    native_threads.set_threading(default_mode)
    med = _medians(lat)
    return {"op": op_type, "threads": threads, "ort_ms": med["ort"], "fused_ms": med["fused"],
            "ort_aa_ms": med["ort_aa"], "fused_over_ort": ratio(lat["fused"], lat["ort"]),
            "aa_control": ratio(lat["ort_aa"], lat["ort"]), "max_rel_diff_vs_ort": diff,
            "extra_ms": {k: med[k] for k in extra or {}},
            "variants": {m: {"fused_ms": med[f"fused[{m}]"], "fused_over_ort": ratio(lat[f"fused[{m}]"], lat["ort"])}
                         for m in args.fused_threading if m != default_mode}}


def _threaded(run, mode: str):
    """``run`` with the native ops' threading mode set to ``mode`` first (``native.set_threading``)."""
    def go():
        native_threads.set_threading(mode)
        run()
    return go


def chain_available() -> bool:
    """Is a native FusedEltwiseChain kernel registered in NATIVE_OPS (another module may add it)?"""
    return any(name.startswith("FusedEltwiseChain") for name in native_op_table())


def native_table(args, thread_counts, sizes, cases, gemm_acts) -> dict:
    """Every case at every size and thread count, with the copy and MatMul peaks of the same run."""
    rows, mm, skipped = [], {}, {}
    saved_threads = numba.get_num_threads()
    for threads in thread_counts:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        mm[threads] = matmul_peak(threads, args)
        print(f"[{threads} thr] ORT MatMul {MATMUL_PEAK_DIM}^3: {mm[threads]:.1f} GFLOP/s", file=sys.stderr, flush=True)
        for n in sizes:
            copies = copy_runners(n, threads, args)
            for case in cases:
                pattern, prefix = ELTWISE_CASES[case]
                unfused, feeds, nbytes = unfused_eltwise(case, n)
                fused, op_type = fused_by_rewrite(unfused, pattern, prefix)
                if fused is None:
                    skipped[case] = op_type
                    continue
                out_shape = next(iter(feeds.values())).shape
                row = {"kernel": case, "size": _fmt_n(n), "n": n,
                       **compare_native(unfused, fused, op_type, feeds, out_shape, threads, args, copies)}
                row["gbs"] = nbytes / (row["fused_ms"] / 1000) / 1e9
                row["ort_gbs"] = nbytes / (row["ort_ms"] / 1000) / 1e9
                row["copy_gbs"] = {k[5:]: 8 * n / (v / 1000) / 1e9 for k, v in row.pop("extra_ms").items()}
                row["peak"] = max(row["copy_gbs"].values())
                row["pct_peak"] = 100 * row["gbs"] / row["peak"]
                row["pct_plain_copy"] = 100 * row["gbs"] / row["copy_gbs"]["numba"]
                rows.append(row)
                _progress(row, "GB/s")
        for label, (m, k, nn) in GEMM_SHAPES.items():
            for act in gemm_acts:
                unfused, fused, feeds, flops = gemm_models(m, k, nn, act)
                row = {"kernel": f"gemm_{act or 'none'}", "size": f"{label} {m}x{k}x{nn}", "n": m * nn,
                       **compare_native(unfused, fused, "FusedGemmAct", feeds, (m, nn), threads, args)}
                row["gflops"] = flops / (row["fused_ms"] / 1000) / 1e9
                row["ort_gflops"] = flops / (row["ort_ms"] / 1000) / 1e9
                row["peak"] = mm[threads]
                row["pct_peak"] = 100 * row["gflops"] / mm[threads]
                rows.append(row)
                _progress(row, "GFLOP/s")
    numba.set_num_threads(saved_threads)
    return {"rows": rows, "skipped": skipped, "matmul_gflops": {str(t): v for t, v in mm.items()}}


def _progress(row: dict, unit: str) -> None:
    rate = row["gbs"] if unit == "GB/s" else row["gflops"]
    copies = " ".join(f"{k} {v:.1f}" for k, v in row.get("copy_gbs", {}).items())
    print(f"  {row['kernel']:18s} {row['size']:>16s} {row['threads']} thr  ort {row['ort_ms']:8.3f} ms  fused "
          f"{row['fused_ms']:8.3f} ms  fused/ort {row['fused_over_ort']:.2f}  A/A {row['aa_control']:.2f}  "
          f"{rate:.1f} {unit} ({row['pct_peak']:.0f}%){'  copy GB/s: ' + copies if copies else ''}"
          + "".join(f"  [{m}] {v['fused_ms']:.3f} ms {v['fused_over_ort']:.2f}"
                    for m, v in row.get("variants", {}).items()),
          file=sys.stderr, flush=True)


def print_native(result: dict) -> None:
    print("| kernel | size | threads | copy GB/s: ORT Identity | numpy copyto | numba plain stores "
          "| numba non-temporal |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        if "copy_gbs" in r:
            c = r["copy_gbs"]
            print(f"| {r['kernel']} | {r['size']} | {r['threads']} | {c['ort_identity']:.1f} | {c['numpy']:.1f} | "
                  f"{c['numba']:.1f} | {max(c['numba_nt'], c.get('numba_nt_prange', 0)):.1f} |")
    print()
    print("| kernel | size | threads | fused ms | ORT ms | fused/ORT | A/A | fused GB/s or GFLOP/s "
          "| % of best copy or MatMul peak | % of plain-store copy |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        rate = f"{r['gbs']:.1f} GB/s" if "gbs" in r else f"{r['gflops']:.1f} GFLOP/s"
        plain = f"{r['pct_plain_copy']:.0f}%" if "pct_plain_copy" in r else ""
        print(f"| {r['kernel']} | {r['size']} | {r['threads']} | {r['fused_ms']:.3f} | {r['ort_ms']:.3f} | "
              f"{r['fused_over_ort']:.2f} | {r['aa_control']:.2f} | {rate} | {r['pct_peak']:.0f}% | {plain} |")
    variants = [(r, m, v) for r in result["rows"] for m, v in r.get("variants", {}).items()]
    if variants:
        print()
        print("| kernel | size | threads | native threading | fused ms | fused/ORT | default mode fused/ORT |")
        print("|---|---|---:|---|---:|---:|---:|")
        for r, m, v in variants:
            print(f"| {r['kernel']} | {r['size']} | {r['threads']} | {m} | {v['fused_ms']:.3f} | "
                  f"{v['fused_over_ort']:.2f} | {r['fused_over_ort']:.2f} |")
    for case, why in result["skipped"].items():
        print(f"skipped {case}: {why}")


def _fmt_n(n: int) -> str:
    return f"{n // (1 << 20)}M" if n % (1 << 20) == 0 else f"{n // 1024}K" if n % 1024 == 0 else str(n)


def dispatcher_table(kernels, args, env) -> dict:
    """The numba kernels of kernels/eltwise.py through their dispatcher against stock ORT (``--dispatcher``)."""
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
              f"{r['fused_over_ort']:.2f} | {r['aa_control']:.2f} | {r['fused_gbs']:.1f} | "
              f"{r['fused_pct_copy']:.0f}% |")
    return {"env": env, "copy_gbs": {str(k): v for k, v in copy.items()}, "rows": rows}


def _llc() -> str:
    try:
        return Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    except OSError:
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--large", type=int, default=1 << 25, help="elements of the large tensor (default 32M)")
    ap.add_argument("--small", type=int, default=1 << 16, help="elements of the small tensor (default 64K)")
    ap.add_argument("--cases", default=",".join(ELTWISE_CASES), help="native elementwise cases")
    ap.add_argument("--gemm", default=",".join(a or "none" for a in GEMM_ACTS),
                    help="FusedGemmAct epilogues (none,relu,...; empty: no GEMM cases)")
    ap.add_argument("--threads", default="1,2", help="intra-op thread counts of every session")
    ap.add_argument("--kernels", default=",".join(KERNELS), help="numba kernels (--dispatcher, --threshold)")
    ap.add_argument("--runs", type=int, default=15, help="timed passes per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gap-ms", type=float, default=0.0, help="idle sleep before every single run")
    ap.add_argument("--no-spin", action="store_true", help="ORT sessions with intra-op spinning off")
    ap.add_argument("--parallel-min", type=int, default=E.PARALLEL_MIN,
                    help="--dispatcher: parallel_min passed to the kernels (default: eltwise.PARALLEL_MIN, serial)")
    ap.add_argument("--fused-threading", default="",
                    help="also time the fused op with these native threading modes (serial,numba), same session")
    ap.add_argument("--dispatcher", action="store_true",
                    help="time the numba kernels through their dispatcher instead of the native ops in ORT")
    ap.add_argument("--threshold", action="store_true", help="serial vs prange over sizes instead")
    ap.add_argument("--json", help="also write the raw numbers as JSON to this path")
    args = ap.parse_args(argv)
    kernels = [k for k in args.kernels.split(",") if k]
    args.fused_threading = [m for m in args.fused_threading.split(",") if m]

    env = {"numba": numba.__version__, "onnxruntime": ort.__version__, "numpy": np.__version__,
           "numba_threads": numba.get_num_threads(), "threading_layer": None, "cpus": os.cpu_count(),
           "llc": _llc(), "parallel_min": args.parallel_min, "loadavg_before": os.getloadavg()}
    print(f"load average before: {' '.join(f'{v:.2f}' for v in env['loadavg_before'])}", file=sys.stderr, flush=True)
    if args.threshold:
        sizes = [1 << k for k in range(14, 23)]
        rows = threshold_table([k for k in kernels if k in E.UNARY_KERNELS or k == "add_relu"], sizes, args)
        env["threading_layer"] = numba.threading_layer()
        result = {"env": env, "threshold": rows}
    elif args.dispatcher:
        result = dispatcher_table(kernels, args, env)
    else:
        cases = [c for c in args.cases.split(",") if c]
        unknown = sorted(set(cases) - set(ELTWISE_CASES))
        if unknown:
            ap.error(f"unknown cases {unknown}; known: {sorted(ELTWISE_CASES)}")
        if not chain_available():
            cases = [c for c in cases if ELTWISE_CASES[c][0] != "eltwise_chain"]
            print("no native FusedEltwiseChain kernel registered: chain cases skipped", file=sys.stderr)
        acts = [("" if a == "none" else a) for a in args.gemm.split(",") if a]
        threads = [int(t) for t in args.threads.split(",") if t]
        result = native_table(args, threads, [args.small, args.large], cases, acts)
        env["native_threading"] = native_threads.threading_settings()
        env["loadavg_after"] = os.getloadavg()
        result["env"] = env
        print(f"onnxruntime {env['onnxruntime']} ORT_ENABLE_ALL{' spinning off' if args.no_spin else ''}, "
              f"native ops threading {env['native_threading']}, numba {env['numba']}; LLC {env['llc']}; "
              f"{args.repeats} repeats x {args.runs} interleaved runs (ort, ort_aa, fused), gap {args.gap_ms} ms; "
              f"load average {' '.join(f'{v:.2f}' for v in env['loadavg_before'])} before, "
              f"{' '.join(f'{v:.2f}' for v in env['loadavg_after'])} after")
        print("ORT MatMul 1024^3 GFLOP/s: " + ", ".join(f"{t} thr {v:.1f}" for t, v in result["matmul_gflops"].items()))
        print()
        print_native(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
