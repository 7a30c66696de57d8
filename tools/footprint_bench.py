"""What a fused process costs beside stock ORT: import + session creation time and peak RSS of fresh
processes, and whether numba or llvmlite were imported.

Usage::

    python tools/footprint_bench.py [--models db_text_detector,minilm_encoder,yolov8n] [--rounds 5]
                                    [--threads 2] [--json benchmarks/results/]

Per model: one priming process fills the plan cache (``fusion=True``), then ``--rounds`` rounds of
fresh processes in the order stock, fused, fused, stock (A B B A, docs/ARCHITECTURE.md §8), each timing
``import`` + ``InferenceSession(...)`` + one run, and reading its peak RSS (``ru_maxrss``). Reported:
medians, the fused/stock ratio of the medians, the fused-minus-stock RSS, and the modules loaded.
Plan caches live in a temporary ``ORTFUSE_CACHE_DIR``; the ops library is the machine's (``ortfuse
ops-library``), named with ``ORTFUSE_OPS_LIBRARY`` so the temporary cache does not hide it.
ortfuse's modules are compiled to bytecode first, as ``pip install`` does for an installed package:
stock ORT's modules have theirs, and an editable checkout run with ``PYTHONDONTWRITEBYTECODE`` would
otherwise compile every ortfuse module from source in each process.
The footprint bound, printed per model: fused creation <= 1.3 x stock's + 0.05 s, RSS <= stock's + 15 MB.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

_CHILD = r"""
import sys, time, resource
t0 = time.perf_counter()
fused = sys.argv[2] == "fused"
if fused:
    import ortfuse as ort
else:
    import onnxruntime as ort
import numpy as np
so = ort.SessionOptions()
if int(sys.argv[3]):
    so.intra_op_num_threads = int(sys.argv[3])
kw = {"fusion": True} if fused else {}
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"], **kw)
t1 = time.perf_counter()
feeds = {}
for i in s.get_inputs():
    shape = [d if isinstance(d, int) else 1 for d in i.shape]
    feeds[i.name] = np.zeros(shape, np.int64) if "int64" in i.type else np.zeros(shape, np.float32)
s.run(None, feeds)
print("RESULT", t1 - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
      int("numba" in sys.modules), int("llvmlite" in sys.modules))
"""


def _child(path: str, kind: str, threads: int, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, path, kind, str(threads)], capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"{kind} process failed: {(done.stderr or done.stdout).strip()[-500:]}")
    _, secs, rss, numba, llvm = line.split()
    return {"seconds": float(secs), "rss_mb": float(rss), "numba": bool(int(numba)), "llvmlite": bool(int(llvm))}


def compile_bytecode() -> list[str]:
    """Compile ortfuse's packages to bytecode beside their sources (what an installed wheel has)."""
    import compileall

    import ortfuse
    import ortfuse.custom_ops

    folders = [str(Path(m.__file__).resolve().parent) for m in (ortfuse, ortfuse.custom_ops)]
    for folder in folders:
        compileall.compile_dir(folder, quiet=1)
    return folders


def within_bound(r: dict) -> bool:
    """The footprint bound on a warm fused process beside stock ORT's."""
    m = r["median"]
    return (m["fused"]["seconds"] <= 1.3 * m["stock"]["seconds"] + 0.05
            and r["rss_extra_mb"] <= 15 and not r["fused_numba_loaded"] and not r["fused_llvmlite_loaded"])


def measure(model: str, rounds: int, threads: int, env: dict) -> dict:
    import models

    path = str(models.build(model))
    _child(path, "fused", threads, env)  # priming: plans and caches
    runs: dict[str, list] = {"stock": [], "fused": []}
    for _ in range(rounds):
        for kind in ("stock", "fused", "fused", "stock"):
            runs[kind].append(_child(path, kind, threads, env))
    med = {k: {field: statistics.median(r[field] for r in v) for field in ("seconds", "rss_mb")}
           for k, v in runs.items()}
    return {"model": model, "median": med,
            "creation_ratio": med["fused"]["seconds"] / med["stock"]["seconds"],
            "rss_extra_mb": med["fused"]["rss_mb"] - med["stock"]["rss_mb"],
            "fused_numba_loaded": any(r["numba"] for r in runs["fused"]),
            "fused_llvmlite_loaded": any(r["llvmlite"] for r in runs["fused"]), "raw": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="db_text_detector,minilm_encoder,yolov8n")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the results (a folder: footprint_bench-<models>-<date>.json)")
    args = ap.parse_args(argv)
    from ortfuse.custom_ops.aot.library import library_path

    compile_bytecode()
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "ORTFUSE_CACHE_DIR": cache, "ORTFUSE_OPS_LIBRARY": str(library_path())}
        env.setdefault("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "ortfuse" / "numba"))
        results = []
        for model in [m for m in args.models.split(",") if m]:
            r = measure(model, args.rounds, args.threads, env)
            r["within_bound"] = within_bound(r)
            results.append(r)
            m = r["median"]
            print(f"{model:20s} stock {m['stock']['seconds']:.3f} s {m['stock']['rss_mb']:.0f} MB | fused "
                  f"{m['fused']['seconds']:.3f} s {m['fused']['rss_mb']:.0f} MB | ratio {r['creation_ratio']:.2f}, "
                  f"+{r['rss_extra_mb']:.0f} MB, numba {r['fused_numba_loaded']}, "
                  f"llvmlite {r['fused_llvmlite_loaded']}; within the bound: {r['within_bound']}")
    if args.json:
        from ortfuse.bench.output import result_file

        stem = f"footprint_bench-{'+'.join(r['model'] for r in results)}-{datetime.date.today()}"
        out = Path(result_file(args.json, stem))
        out.write_text(json.dumps({"tool": "footprint_bench", "settings": {**vars(args), "bytecode": "compiled"},
                                   "results": results}, indent=1))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
