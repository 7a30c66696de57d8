"""Cold and warm session-creation time of ``ortfuse.InferenceSession`` against stock ORT.

Usage::

    python tools/creation_bench.py [--models resnet50,bert_encoder] [--fusion true,auto]
                                   [--cold 2] [--warm 3] [--threads 0] [--json PATH]

Each measurement is a fresh Python process (``--child``) that imports ortfuse, then creates, in
this order, a stock ``onnxruntime.InferenceSession`` (``stock``), the ortfuse session
(``fused``, ``fusion=True`` or ``"auto"``) and a second stock session (``stock_again``: ORT's own
creation once its process-wide set-up is done), all from the same model file, CPU provider,
ORT_ENABLE_ALL. *cold*: numba's cache (``NUMBA_CACHE_DIR``) and ortfuse's cache
(``ORTFUSE_CACHE_DIR``: fusion plans, auto-tuning decisions) are new empty folders; *warm*: the same
folders again, filled by the cold run before. ``fusion="auto"`` measures the candidate fusions
against ORT on a cold cache (seconds), so it is reported on its own rows.

``--empty-cache`` measures the creation target instead: for each model, rounds of fresh
processes in the order stock, auto, auto, stock (docs/ARCHITECTURE.md §8), each timing ``import``
(``onnxruntime`` for stock, ``ortfuse`` for auto) + ``InferenceSession(...)`` from the process's
first statement; every auto process gets a new empty ``ORTFUSE_CACHE_DIR`` (nothing known on this
machine, the default ``ORTFUSE_TUNE=background``). Reported per model: the medians, the limit
``2 x stock + 1 s``, whether auto's median is within it, and which of onnx / numba the auto process
imported (``python -X importtime`` on one such process says where its time goes)::

    python tools/creation_bench.py --empty-cache --models all --rounds 3 --threads 2 --json benchmarks/results/

The child also reports what numba compiled or loaded in the process: every numba function of
``ortfuse.custom_ops`` that holds a compiled signature (with its cache misses = compiled here,
and hits = loaded from disk) and the native ops registered; the parent lists the functions whose
cache index files the cold run wrote. Only what the model's fused ops need should appear.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))


# ---------------------------------------------------------------------------------------------
# child: one fresh process, one measurement
# ---------------------------------------------------------------------------------------------

def _numba_functions() -> dict[str, dict]:
    """numba functions of ortfuse.custom_ops with compiled code in this process: name -> counts."""
    from numba.core.registry import CPUDispatcher

    found = {}
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("ortfuse.custom_ops") or mod is None:
            continue
        for attr, obj in list(vars(mod).items()):
            if isinstance(obj, CPUDispatcher) and obj.signatures and obj.__module__ == mod_name:
                found[f"{mod_name.rsplit('.', 1)[-1]}.{attr}"] = {
                    "signatures": len(obj.signatures),
                    "compiled": sum(obj._cache_misses.values()), "loaded": sum(obj._cache_hits.values())}
    try:
        from ortfuse.custom_ops.native import lifetime
    except ImportError:
        return found
    for fn, cf in list(lifetime.COMPILED.items()):  # cfuncs: compute callbacks and workers
        found[f"cfunc {fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"] = {
            "signatures": 1, "compiled": int(cf.cache_hits == 0), "loaded": cf.cache_hits}
    return found


def child(model_path: str, fusion: str, threads: int) -> dict:
    t0 = time.perf_counter()
    import onnxruntime as ort

    import ortfuse
    t_import = time.perf_counter() - t0
    from ortfuse.foundation.session_options import TUNE_KEY, make_options

    def options():  # auto-sync: auto tuned at creation (the measuring counts); auto: the default, background
        so = make_options("ORT_ENABLE_ALL", threads=threads)
        if fusion == "auto-sync":
            so.add_session_config_entry(TUNE_KEY, "sync")
        return so

    providers = ["CPUExecutionProvider"]
    out: dict[str, Any] = {"import_s": t_import}
    t0 = time.perf_counter()
    ort.InferenceSession(model_path, options(), providers=providers)
    out["stock_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sess = ortfuse.InferenceSession(model_path, options(), providers=providers,
                                    fusion="auto" if fusion.startswith("auto") else True)
    out["fused_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ort.InferenceSession(model_path, options(), providers=providers)
    out["stock_again_s"] = time.perf_counter() - t0
    report = sess.fusion_report
    out["applied"] = report.applied
    out["fused_ops"] = report.counts()
    out["kernels"] = sorted({m.kernel for m in report.fused})
    out["notes"] = report.notes
    try:
        from ortfuse.custom_ops.native.install import registered_ops

        out["native_registered"] = registered_ops()
    except ImportError:
        out["native_registered"] = []
    out["numba_functions"] = _numba_functions()
    out["numba_imported"] = "numba" in sys.modules
    return out


_FRESH_CHILD = r"""
import sys, time
t0 = time.perf_counter()
auto = sys.argv[2] == "auto"
if auto:
    import ortfuse as ort
else:
    import onnxruntime as ort
so = ort.SessionOptions()
if int(sys.argv[3]):
    so.intra_op_num_threads = int(sys.argv[3])
kw = {"fusion": "auto"} if auto else {}
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"], **kw)
seconds = time.perf_counter() - t0
import json
print("RESULT " + json.dumps({"seconds": seconds, "onnx": "onnx" in sys.modules, "numba": "numba" in sys.modules,
                              "status": s.fusion_status if auto else ""}))
"""


def fresh_child(model_path: str, kind: str, threads: int, work: Path) -> dict:
    """One fresh process: import + creation (``kind`` stock or auto; auto in a new empty cache)."""
    env = {**os.environ, "ORTFUSE_CACHE_DIR": tempfile.mkdtemp(prefix="cache_", dir=work)}
    env.pop("ORTFUSE_TUNE", None)
    done = subprocess.run([sys.executable, "-c", _FRESH_CHILD, model_path, kind, str(threads)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        return {"error": (done.stderr or done.stdout).strip()[-500:]}
    return json.loads(line[len("RESULT "):])


def empty_cache(names: list[str], rounds: int, threads: int, work: Path) -> list[dict]:
    """The ``--empty-cache`` rows (see the module docstring)."""
    import ortfuse.models as zoo

    results = []
    for name in names:
        path = zoo.resolve(name)
        runs: dict[str, list[dict]] = {"stock": [], "auto": []}
        for _ in range(rounds):
            for kind in ("stock", "auto", "auto", "stock"):
                runs[kind].append(fresh_child(path, kind, threads, work))
        failed = [r["error"] for rs in runs.values() for r in rs if "error" in r]
        row: dict = {"model": name, "raw": runs, "errors": failed}
        if not failed:
            stock = statistics.median(r["seconds"] for r in runs["stock"])
            auto = statistics.median(r["seconds"] for r in runs["auto"])
            row.update(stock_s=round(stock, 3), auto_s=round(auto, 3), limit_s=round(2 * stock + 1, 3),
                       within=auto <= 2 * stock + 1, ratio=round(auto / stock, 3),
                       auto_imported_onnx=any(r["onnx"] for r in runs["auto"]),
                       auto_imported_numba=any(r["numba"] for r in runs["auto"]),
                       auto_status=runs["auto"][0]["status"])
        results.append(row)
        print(f"  {name:24s} " + (f"stock {row['stock_s']:.3f} s, auto {row['auto_s']:.3f} s (limit "
                                    f"{row['limit_s']:.3f} s: {'met' if row['within'] else 'NOT met'}), onnx "
                                    f"{row['auto_imported_onnx']}, numba {row['auto_imported_numba']}"
                                    if not failed else f"FAILED: {failed[0]}"), file=sys.stderr, flush=True)
    return results


def empty_cache_main(args, work: Path) -> int:
    from ortfuse.bench.environment import environment
    from ortfuse.models import NAMES

    names = list(NAMES) if args.models == "all" else [m for m in args.models.split(",") if m]
    env_before = environment()
    results = empty_cache(names, args.rounds, args.threads, work)
    print("| model | stock ORT s | auto s | limit 2x + 1 s | met | auto imported onnx / numba |")
    print("|---|---:|---:|---:|---|---|")
    for r in results:
        if r["errors"]:
            print(f"| {r['model']} | failed | | | no | |")
            continue
        print(f"| {r['model']} | {r['stock_s']:.3f} | {r['auto_s']:.3f} | {r['limit_s']:.3f} | "
              f"{'yes' if r['within'] else 'NO'} | {r['auto_imported_onnx']} / {r['auto_imported_numba']} |")
    if args.json:
        from ortfuse.bench.output import result_file

        out = Path(result_file(args.json, f"creation_bench-empty_cache-{_dt.date.today().isoformat()}"))
        out.write_text(json.dumps({"tool": "creation_bench", "mode": "empty_cache", "settings": vars(args),
                                   "environment": env_before, "load_average_after": os.getloadavg(),
                                   "results": results}, indent=1))
        print(f"wrote {out}")
    return 0 if all(r.get("within") for r in results) else 1


# ---------------------------------------------------------------------------------------------
# parent
# ---------------------------------------------------------------------------------------------

def run_child(model_path: Path, fusion: str, threads: int, numba_dir: Path, cache_dir: Path) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(numba_dir), "ORTFUSE_CACHE_DIR": str(cache_dir)}
    proc = subprocess.run([sys.executable, __file__, "--child", str(model_path), fusion, str(threads)],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cached_functions(numba_dir: Path) -> list[str]:
    """Functions with a numba cache index (``<module>.<qualname>-<line>.py<ver>.nbi``) in the folder."""
    names = set()
    for path in numba_dir.rglob("*.nbi"):
        stem = path.name.split(".py")[0]
        names.add(stem.rsplit("-", 1)[0])
    return sorted(names)


def bench_model(name: str, fusion: str, args, work: Path) -> dict:
    import onnx

    from models.registry import make

    model_path = work / f"{name}.onnx"
    if not model_path.exists():
        onnx.save(make(name), str(model_path))
    res: dict[str, Any] = {"model": name, "fusion": fusion, "cold": [], "warm": []}
    for k in range(args.cold):
        numba_dir, cache_dir = work / f"numba_{name}_{fusion}_{k}", work / f"ortfuse_{name}_{fusion}_{k}"
        numba_dir.mkdir()
        cache_dir.mkdir()
        res["cold"].append(run_child(model_path, fusion, args.threads, numba_dir, cache_dir))
        res["cold"][-1]["cache_index_files"] = cached_functions(numba_dir)
        print(f"  {name} fusion={fusion} cold #{k}: {_line(res['cold'][-1])}", file=sys.stderr, flush=True)
    for k in range(args.warm):
        res["warm"].append(run_child(model_path, fusion, args.threads, numba_dir, cache_dir))
        print(f"  {name} fusion={fusion} warm #{k}: {_line(res['warm'][-1])}", file=sys.stderr, flush=True)
    return res


def _line(r: dict) -> str:
    compiled = sum(1 for f in r["numba_functions"].values() if f["compiled"])
    return (f"import {r['import_s']:.2f} s, stock {r['stock_s']:.2f} s, fused {r['fused_s']:.2f} s, stock again "
            f"{r['stock_again_s']:.2f} s; fused ops {r['fused_ops']}; native {r['native_registered']}; numba "
            f"functions compiled {compiled}, loaded {sum(1 for f in r['numba_functions'].values() if f['loaded'])}; "
            f"numba imported: {r['numba_imported']}")


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def print_table(results: list[dict]) -> None:
    print("| model | fusion | cache | runs | import s | stock ORT s | ortfuse s | ortfuse / stock | stock again s "
          "| numba functions compiled / loaded | native ops |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    for res in results:
        for kind in ("cold", "warm"):
            rows = res[kind]
            if not rows:
                continue
            stock, fused = _median(rows, "stock_s"), _median(rows, "fused_s")
            funcs = rows[0]["numba_functions"].values()
            compiled = sum(1 for f in funcs if f["compiled"])
            loaded = sum(1 for f in funcs if f["loaded"])
            print(f"| {res['model']} | {res['fusion']} | {kind} | {len(rows)} | {_median(rows, 'import_s'):.2f} | "
                  f"{stock:.2f} | {fused:.2f} | {fused / stock:.1f}x | {_median(rows, 'stock_again_s'):.2f} | "
                  f"{compiled} / {loaded} | {', '.join(rows[0]['native_registered']) or 'none'} |")


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,bert_encoder")
    ap.add_argument("--fusion", default="true,auto", help="fusion values to measure: true, auto (background "
                    "tuning, the default), auto-sync (tuned at creation)")
    ap.add_argument("--cold", type=int, default=2, help="cold processes per model and fusion value")
    ap.add_argument("--warm", type=int, default=3, help="warm processes per model and fusion value")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads of every session (0: ORT's default)")
    ap.add_argument("--workdir", help="folder for models and caches (default: a new temp folder)")
    ap.add_argument("--json", help="also write the raw numbers as JSON to this path (--empty-cache: a folder "
                    "takes creation_bench-empty_cache-<date>.json)")
    ap.add_argument("--empty-cache", action="store_true", help="fresh processes, stock vs fusion='auto' with an "
                    "empty cache, interleaved (--models all: the whole zoo)")
    ap.add_argument("--rounds", type=int, default=3, help="--empty-cache: rounds of stock, auto, auto, stock")
    args = ap.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ortfuse_creation_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.empty_cache:
        return empty_cache_main(args, work)
    load_before = os.getloadavg()
    print(f"load average before: {' '.join(f'{v:.2f}' for v in load_before)}; work folder {work}", file=sys.stderr)
    results = [bench_model(m, f, args, work) for m in args.models.split(",") if m
               for f in args.fusion.split(",") if f]
    load_after = os.getloadavg()
    print(f"load average {' '.join(f'{v:.2f}' for v in load_before)} before, "
          f"{' '.join(f'{v:.2f}' for v in load_after)} after; cold = empty NUMBA_CACHE_DIR and ORTFUSE_CACHE_DIR, "
          "warm = the same folders filled; each row the median of fresh processes")
    print()
    print_table(results)
    for res in results:
        cold = res["cold"][0] if res["cold"] else None
        if cold:
            print(f"\n{res['model']} fusion={res['fusion']} cold: compiled "
                  f"{sorted(k for k, f in cold['numba_functions'].items() if f['compiled'])}; cache index files "
                  f"written for {cold['cache_index_files']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"load_before": load_before, "load_after": load_after,
                                               "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
