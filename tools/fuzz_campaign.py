#!/usr/bin/env python
"""Long mutation-fuzz campaigns: stock ORT vs ortfuse(fusion=True) on mutated models.

    python tools/fuzz_campaign.py --cases 5000 --seed 1 [--workers 2] [--timeout 60]
    python tools/fuzz_campaign.py --replay CASE_SEED          # one case, in this process, verbose
    python tools/fuzz_campaign.py --replay-file tests/fixtures/crashes/*.onnx

Cases come from tests/mutation_models.py (a base model where a pattern fires, then 1-2 mutations:
dropped nodes, wrong attribute types, shape lies, swapped inputs, bad initializers, other opsets...);
case ``i`` uses the seed ``SEED * 10_000_000 + i``, so any case is reproduced by its seed alone.
The property (``mutation_models.compare``): both succeed with outputs equal to stock ORT at
ORT_DISABLE_ALL (rtol 1e-4, atol 1e-5 x max(1, max|ref|)), or both raise the same exception class.

Executions: case ``seed`` runs both sides through ``run``, ORT's parallel executor or ``run_async``
(``seed % 3``; mutation_models.EXECUTIONS).

Kernels: odd-numbered workers run with ``ORTFUSE_NATIVE=0`` (numpy reference kernels through
onnxruntime-extensions' Python ops), the others with the native kernels (``--no-mix-reference``: all
native). Each worker first loads ortfuse and its kernels on three cases that are not counted.

Isolation: cases run in worker subprocesses (one per ``--workers``), never in this process. A worker
announces each case before running it, so when it dies (segfault, abort) or exceeds ``--timeout``
(a hang) the case is known exactly: it is recorded, its model saved as a regression fixture under
``--save-dir`` (default tests/fixtures/crashes/, replayed by tests/test_mutation_fuzz.py), and a fresh
worker continues. Mismatches are saved under ``--mismatch-dir``. Prints the numbers of cases tried,
crashes, hangs and mismatches; exit status 1 if there was any crash, hang or mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
SEED_STRIDE = 10_000_000


def case_seed(seed: int, i: int) -> int:
    return seed * SEED_STRIDE + i


def execution_for(seed: int) -> str:
    """How case ``seed`` is run on both sides (mutation_models.EXECUTIONS): run, ORT's parallel
    executor or run_async, in turn."""
    import mutation_models as mm

    return mm.EXECUTIONS[seed % len(mm.EXECUTIONS)]


# ------------------------------------------------------------------------------------------------
# worker side
# ------------------------------------------------------------------------------------------------
def _quiet_ort() -> None:
    import onnxruntime as ort

    ort.set_default_logger_severity(4)


def _verdict_record(v) -> dict:
    return {"kind": v.kind, "detail": v.detail, "fused": v.fused,
            "error": (v.stock.error if v.stock and not v.stock.ok else "")}


def _selftest_fault(seed: int) -> None:
    """Self-test hooks (tests/test_mutation_fuzz.py): a real segfault or a hang on a chosen case."""
    if os.environ.get("ORTFUSE_FUZZ_SELFTEST_SEGFAULT") == str(seed):
        import ctypes

        ctypes.string_at(0)  # SIGSEGV
    if os.environ.get("ORTFUSE_FUZZ_SELFTEST_HANG") == str(seed):
        time.sleep(10**6)


def _warm_up() -> None:
    """Import ortfuse and load the native kernels once, so that a case's time limit measures the case."""
    import mutation_models as mm

    c = mm.Chooser(0)
    for _ in range(3):
        model, feeds, _ = mm.base_model(c)
        mm.compare(model.SerializeToString(), feeds)


def worker_main() -> int:
    """Read case seeds (one per line) and answer one JSON line each: {"start": s} then the verdict."""
    import mutation_models as mm

    _quiet_ort()
    if os.environ.get("ORTFUSE_FUZZ_NO_WARMUP") != "1":
        _warm_up()
    out = sys.stdout
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        seed = int(line)
        out.write(json.dumps({"start": seed}) + "\n")
        out.flush()
        _selftest_fault(seed)
        try:
            data, feeds, steps = mm.make_case(mm.Chooser(seed))
            execution = execution_for(seed)
            record = {"seed": seed, "steps": steps, "execution": execution,
                      **_verdict_record(mm.compare(data, feeds, execution))}
        except Exception as exc:  # a bug of the generator or of compare itself: report, keep going
            record = {"seed": seed, "steps": [], "kind": "harness_error", "detail": f"{type(exc).__name__}: {exc}",
                      "fused": False, "error": ""}
        out.write(json.dumps(record) + "\n")
        out.flush()
    return 0


def replay_main(seed: int | None, paths: list[str] | None) -> int:
    """Run the case (or each saved case) here and print what happened; exit 0 unless one is a mismatch."""
    if paths and len(paths) > 1:
        return max(replay_main(None, [p]) for p in paths)
    import onnx

    import mutation_models as mm

    _quiet_ort()
    path = paths[0] if paths else None
    if path:
        data, feeds = mm.load_case(path)
        note = path[:-5] + ".txt"
        steps, execution = [path], "run"
        if os.path.exists(note):
            with open(note) as fh:
                steps = [fh.read().strip()]
            execution = next((line.split(":", 1)[1].strip() for line in steps[0].splitlines()
                              if line.startswith("execution:")), "run")
    else:
        data, feeds, steps = mm.make_case(mm.Chooser(seed))
        execution = execution_for(seed)
    print("case:", " | ".join(steps), f"(execution: {execution})")
    print("feeds:", {k: (v.dtype.name, v.shape) for k, v in feeds.items()})
    try:
        print(onnx.printer.to_text(onnx.load_from_string(data).graph)[:4000])
    except Exception as exc:
        print(f"(model not printable: {type(exc).__name__})")
    v = mm.compare(data, feeds, execution)
    print(f"verdict: {v.kind} {v.detail}" + (f" [{os.path.basename(path)}]" if path else ""), flush=True)
    for label, o in (("stock", v.stock), ("ortfuse", v.ours)):
        if o is not None and not o.ok:
            print(f"{label}: {o.error} at {o.phase}: {o.message[:300]}")
    return 1 if v.kind == "mismatch" else 0


# ------------------------------------------------------------------------------------------------
# parent side
# ------------------------------------------------------------------------------------------------
class Worker:
    """One worker subprocess and a thread reading its JSON lines into a queue."""

    def __init__(self, reference: bool = False) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
        if reference:  # the numpy reference kernels (onnxruntime-extensions Python ops) instead of native
            env["ORTFUSE_NATIVE"] = "0"
        self.reference = reference
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    @staticmethod
    def _read(stream, q) -> None:
        for line in stream:
            q.put(line)
        q.put(None)  # EOF: the process ended

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)
            del self.stderr[:-40]

    def run(self, seed: int, timeout: float) -> dict:
        """The verdict record of one case, or a crash / hang record."""
        try:
            self.proc.stdin.write(f"{seed}\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return {"seed": seed, "kind": "crash", "detail": "worker gone before the case started"}
        deadline = time.monotonic() + timeout + 120  # the first case also pays imports and compiles
        started = False
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                return {"seed": seed, "kind": "hang", "detail": f"no verdict within {timeout:.0f} s"}
            if line is None:
                code = self.proc.wait()
                tail = "".join(self.stderr[-12:])[-1500:]
                return {"seed": seed, "kind": "crash", "detail": f"worker exited with status {code}\n{tail}"}
            msg = json.loads(line)
            if "start" in msg and not started:
                started = True
                deadline = time.monotonic() + timeout
                continue
            return msg

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:
            self.kill()


def _save(kind: str, seed: int, detail: str, directory: str) -> str:
    import mutation_models as mm

    try:
        data, feeds, steps = mm.make_case(mm.Chooser(seed))
    except Exception as exc:  # the generator itself failed on this seed (a harness error): nothing to save
        return f"(not saved: the case cannot be generated: {type(exc).__name__}: {exc})"
    note = (f"{kind} found by tools/fuzz_campaign.py, case seed {seed}\nexecution: {execution_for(seed)}\n"
            + " | ".join(steps) + "\n" + detail)
    return mm.save_case(directory, f"{kind}_{seed}", data, feeds, note)


def campaign(args) -> int:
    from tqdm import tqdm

    seeds = [case_seed(args.seed, i) for i in range(args.cases)]
    todo: queue.Queue = queue.Queue()
    for s in seeds:
        todo.put(s)
    counts: Counter = Counter()
    problems: list[dict] = []
    lock = threading.Lock()
    bar = tqdm(total=len(seeds), unit="case", dynamic_ncols=True, mininterval=2)

    def drive(reference: bool) -> None:
        worker = Worker(reference)
        while True:
            try:
                seed = todo.get_nowait()
            except queue.Empty:
                break
            record = worker.run(seed, args.timeout)
            record["kernels"] = "reference" if reference else "native"
            try:
                if record["kind"] in ("crash", "hang"):
                    worker.kill()
                    worker = Worker(reference)
                    record["saved"] = _save(record["kind"], seed, record["detail"], args.save_dir)
                elif record["kind"] in ("mismatch", "harness_error"):
                    record["saved"] = _save(record["kind"], seed, record["detail"], args.mismatch_dir)
            except Exception as exc:  # never lose a case: the record stays, without its files
                record["saved"] = f"(not saved: {type(exc).__name__}: {exc})"
            with lock:
                counts["tried"] += 1
                counts[record["kind"]] += 1
                counts["fused"] += bool(record.get("fused"))
                counts["execution " + record.get("execution", "?")] += 1
                if record["kind"] not in ("both_ok", "both_raised"):
                    problems.append(record)
                    tqdm.write(f"{record['kind']}: seed {seed}: {' | '.join(record.get('steps', []))}\n  "
                               f"{record['detail'][:600]}\n  saved {record['saved']}")
                bar.update(1)
                bar.set_postfix(crash=counts["crash"], hang=counts["hang"], mismatch=counts["mismatch"])
        worker.close()

    start = time.monotonic()
    # odd-numbered workers run with ORTFUSE_NATIVE=0, so the reference kernels are fuzzed as well
    threads = [threading.Thread(target=drive, args=(args.mix_reference and i % 2 == 1,)) for i in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bar.close()
    elapsed = time.monotonic() - start
    summary = {"cases_tried": counts["tried"], "both_ok": counts["both_ok"], "both_raised": counts["both_raised"],
               "fusion_applied": counts["fused"], "crashes": counts["crash"], "hangs": counts["hang"],
               "mismatches": counts["mismatch"], "harness_errors": counts["harness_error"],
               "executions": {k.split(" ", 1)[1]: v for k, v in counts.items() if k.startswith("execution ")},
               "seconds": round(elapsed, 1), "seed": args.seed, "workers": args.workers,
               "problems": [{k: v for k, v in p.items() if k != "steps"} | {"steps": p.get("steps", [])}
                            for p in problems]}
    print(f"\ncases tried {summary['cases_tried']} in {elapsed:.0f} s ({args.workers} workers): "
          f"{summary['both_ok']} both ran (equal outputs), {summary['both_raised']} both raised the same class; "
          f"fusion applied in {summary['fusion_applied']}; run as {summary['executions']}")
    print(f"crashes {summary['crashes']}, hangs {summary['hangs']}, mismatches {summary['mismatches']}, "
          f"harness errors {summary['harness_errors']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=1)
    return 1 if problems else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds one case may take (a hang beyond)")
    p.add_argument("--save-dir", default=os.path.join(ROOT, "tests", "fixtures", "crashes"))
    p.add_argument("--mismatch-dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "ortfuse-fuzz-mismatches"))
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--no-mix-reference", dest="mix_reference", action="store_false",
                   help="all workers use native kernels (default: odd workers run with ORTFUSE_NATIVE=0)")
    p.add_argument("--replay", type=int, metavar="CASE_SEED")
    p.add_argument("--replay-file", metavar="MODEL.onnx", nargs="+")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker_main()
    if args.replay is not None or args.replay_file:
        return replay_main(args.replay, args.replay_file)
    return campaign(args)


if __name__ == "__main__":
    sys.exit(main())
