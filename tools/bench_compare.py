"""Compare two ``ortfuse bench --json`` files (say, before and after a change to a kernel).

    python tools/bench_compare.py before.json after.json

Absolute latencies of two separate runs on a shared machine are not comparable (load changes between
them; docs/ARCHITECTURE.md §8). What is comparable is each run's *own* ratio against stock
ORT_ENABLE_ALL, measured interleaved in that run, together with that run's A/A control. So for every
(model, batch, config) present in both files this prints both ratios, their A/A controls, and the
change of ratio; the p50 columns are there for orientation only.
"""

from __future__ import annotations

import argparse
import json
import sys


def _rows(doc: dict) -> dict[tuple, dict]:
    out = {}
    for res in doc["results"]:
        ctrl = (res.get("control") or {}).get("ratio")
        for name, row in res["configs"].items():
            out[(res["model"], res["batch"], name)] = {"p50": row["p50_ms"], "ratio": row.get("ratio"), "aa": ctrl}
    return out


def _f(x, spec=".3f"):
    return "-" if x is None else format(x, spec)


def compare(a: dict, b: dict) -> str:
    ra, rb = _rows(a), _rows(b)
    keys = [k for k in ra if k in rb]
    head = ["model", "batch", "config", "p50 A ms", "p50 B ms", "ratio A (A/A)", "ratio B (A/A)", "B/A of ratios"]
    lines = [head]
    for k in keys:
        x, y = ra[k], rb[k]
        change = y["ratio"] / x["ratio"] if x["ratio"] and y["ratio"] else None
        lines.append(
            [
                k[0],
                str(k[1]),
                k[2],
                _f(x["p50"]),
                _f(y["p50"]),
                f"{_f(x['ratio'])} ({_f(x['aa'])})",
                f"{_f(y['ratio'])} ({_f(y['aa'])})",
                _f(change),
            ]
        )
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    text = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines]
    only = sorted(set(ra) ^ set(rb))
    if only:
        text.append(f"({len(only)} (model, batch, config) entries are in only one of the files)")
    ea, eb = a.get("environment", {}), b.get("environment", {})
    text.append(f"A: {ea.get('date', '?')} {ea.get('cpu_model', '?')} load {ea.get('load_average_1_5_15')}")
    text.append(f"B: {eb.get('date', '?')} {eb.get('cpu_model', '?')} load {eb.get('load_average_1_5_15')}")
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="first bench JSON (before)")
    parser.add_argument("b", help="second bench JSON (after)")
    args = parser.parse_args(argv)
    with open(args.a) as f:
        a = json.load(f)
    with open(args.b) as f:
        b = json.load(f)
    print(compare(a, b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
