"""Where a served request's time goes while ``fusion="auto"`` tunes, beside stock ORT: for each request,
the serving thread's wake-up (arrival to the call), the Python before ORT's C run (ortfuse's counted
path and ORT's own input handling), the C run, and the Python after it; and the time the serving
thread spends in each signal it sends the tuning process (SIGSTOP, SIGCONT; "CONT?": it had the
continuer's thread send SIGCONT).

    python tools/served_path.py --models tiny_ffn[,ppocr_mobile_v2_cls,...] [--seconds 12] [--gap 2x]
                                [--block 8] [--threads 2] [--spinning on] [--json benchmarks/results/]

One process per model, an empty ``ORTFUSE_CACHE_DIR``, CPU provider, ORT_ENABLE_ALL, pool threads
not spinning unless ``--spinning on`` (as ``tools/auto_bench.py``, whose models, feeds and gap this
takes). A serving loop serves blocks of ``--block`` requests in turn, auto, stock, auto, a second
stock session (the A/A control), each an idle gap after the previous one ended, for ``--seconds``; a
stock block holds the tuning as one long served run (as in ``auto_bench``). The C run is timed by a
proxy around each session's ``_sess`` (ORT's C session), the same for every session. Only the
requests that arrived while auto recorded or tuned are summarised (p50 per part, per session); the
differences auto minus stock per part are what the counted path and the tuning cost a request, the
A/A's the noise floor. The JSON file (``--json``) keeps every request's parts and every signal's
duration.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import auto_bench  # noqa: E402

PARTS = ("total", "wake", "pre", "c_run", "post")


class TimedC:
    """ORT's C session with its ``run`` timed: (start, end) of the last run in ``marks[key]``."""

    def __init__(self, sess, key: str, marks: dict) -> None:
        self._sess, self._key, self._marks = sess, key, marks

    def run(self, *args):
        start = time.perf_counter()
        try:
            return self._sess.run(*args)
        finally:
            self._marks[self._key] = (start, time.perf_counter())

    def __getattr__(self, name):
        return getattr(self._sess, name)


def summary(rows: list[dict]) -> dict:
    """p50 (ms) of each part over ``rows`` per session, with auto's and the A/A's differences from stock
    (µs); ``auto_quiet``: auto's requests in which the serving thread sent no signal, ``auto_STOP``,
    ``auto_CONT``...: those in which it sent these signals (in that order)."""
    out: dict = {}
    groups = {"auto": lambda r: r["block"] == "auto",
              "auto_quiet": lambda r: r["block"] == "auto" and not r.get("signals"),
              "stock": lambda r: r["block"] == "stock", "stock_aa": lambda r: r["block"] == "stock_aa"}
    for sent in sorted({r["signals"] for r in rows if r["block"] == "auto" and r.get("signals")}):
        groups[f"auto_{sent}"] = lambda r, sent=sent: r["block"] == "auto" and r.get("signals") == sent
    for block, keep in groups.items():
        picked = [r for r in rows if keep(r)]
        if picked:
            out[block] = {"n": len(picked), **{p: statistics.median(r[p] for r in picked) for p in PARTS}}
    if "stock" in out:
        for block in [b for b in out if b.startswith("auto")] + ["stock_aa"]:
            if block in out:
                out[f"{block}_minus_stock_us"] = {p: round((out[block][p] - out["stock"][p]) * 1e3, 1)
                                                  for p in PARTS}
    return out


def signal_summary(signals: list[tuple[str, float]]) -> dict:
    """Per signal: how many the serving process sent and the p50 / p90 of their durations (µs)."""
    out = {}
    for name in sorted({n for n, _ in signals}):
        took = sorted(us for n, us in signals if n == name)
        out[name] = {"n": len(took), "p50_us": took[len(took) // 2], "p90_us": took[int(0.9 * (len(took) - 1))]}
    return out


def child(model: str, args) -> dict:
    import onnxruntime as ort

    import ortfuse
    from ortfuse.foundation.session_options import measuring_options
    from ortfuse.runtime import served_runs

    signals: list[tuple[str, float]] = []
    send = served_runs._signal
    serving, sent = threading.get_ident(), []  # signals the serving thread sent so far

    def timed_signal(process, name: str) -> None:
        start = time.perf_counter()
        send(process, name)
        signals.append((name, round((time.perf_counter() - start) * 1e6, 2)))
        if threading.get_ident() == serving:
            sent.append(name[3:])

    served_runs._signal = timed_signal
    ask = served_runs._Continuer.request

    def asked(continuer) -> None:  # the serving thread has the continue sent by the continuer's thread
        ask(continuer)
        if threading.get_ident() == serving:
            sent.append("CONT?")

    served_runs._Continuer.request = asked
    path, feeds = auto_bench.model_and_feeds(model)
    cpu = ["CPUExecutionProvider"]

    def options():
        return measuring_options("ORT_ENABLE_ALL", threads=args.threads, spinning=args.spinning == "on")

    sessions = {"stock": ort.InferenceSession(path, options(), providers=cpu),
                "stock_aa": ort.InferenceSession(path, options(), providers=cpu)}
    warm = []
    for i in range(10):
        start = time.perf_counter()
        sessions["stock"].run(None, feeds[i % 8])
        warm.append((time.perf_counter() - start) * 1e3)
    gap = auto_bench._gap_s(args.gap, statistics.median(warm))
    sessions["auto"] = ortfuse.InferenceSession(path, options(), providers=cpu, fusion="auto")
    live = sessions["auto"]._ortfuse_live
    marks: dict = {}
    rows: list[dict] = []
    arrival = time.perf_counter()
    stop_at = arrival + args.seconds
    cycle = 0
    while time.perf_counter() < stop_at:
        block = ("auto", "stock", "auto", "stock_aa")[cycle % 4]
        session = sessions[block]
        if not isinstance(session._sess, TimedC):  # a new C session (a swap): timed from now on
            session._sess = TimedC(session._sess, block, marks)
        tuning = auto_bench.phase(sessions["auto"].fusion_status) in auto_bench.DURING
        held = live.served if live is not None and block != "auto" else None
        if held is not None:
            held.begin()
        try:
            for i in range(args.block):
                time.sleep(max(0.0, arrival - time.perf_counter()))
                woke, before = time.perf_counter(), len(sent)
                session.run(None, feeds[i % 8])
                end = time.perf_counter()
                c_start, c_end = marks[block]
                rows.append({"block": block, "tuning": tuning, "total": (end - arrival) * 1e3,
                             "wake": (woke - arrival) * 1e3, "pre": (c_start - woke) * 1e3,
                             "c_run": (c_end - c_start) * 1e3, "post": (end - c_end) * 1e3,
                             "signals": "+".join(sent[before:])})
                arrival = end + gap
        finally:
            if held is not None:
                held.end()
        cycle += 1
    while_tuning = [r for r in rows if r["tuning"]]
    return {"model": model, "gap_ms": gap * 1e3, "final_status": sessions["auto"].fusion_status,
            "served": len(rows), "while_tuning": summary(while_tuning), "signals": signal_summary(signals),
            "rows": [[r["block"], r["tuning"], *(round(r[p], 4) for p in PARTS), r["signals"]] for r in rows],
            "signal_us": signals}


def line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']}: error: {r['error']}"
    s = r["while_tuning"]
    head = f"{r['model']}: gap {r['gap_ms']:.2f} ms; {r['served']} served; final: {r['final_status'][:60]}"
    rows = [f"  {'while tuning':14} {'n':>5} " + " ".join(f"{p:>7}" for p in PARTS) + "  (p50 ms)"]
    blocks = [b for b in s if "_minus_" not in b]
    for block in blocks:
        rows.append(f"  {block:14} {s[block]['n']:>5} " + " ".join(f"{s[block][p]:7.3f}" for p in PARTS))
    for block in blocks:
        key = f"{block}_minus_stock_us"
        if key in s:
            rows.append(f"  {block + ' - stock':14} {'':>5} " + " ".join(f"{s[key][p]:7.1f}" for p in PARTS) + "  (us)")
    sig = "; ".join(f"{k} n={v['n']} p50 {v['p50_us']:.1f} us p90 {v['p90_us']:.1f} us"
                    for k, v in r["signals"].items())
    return "\n".join([head, *rows, f"  signals sent by the serving process: {sig or 'none'}"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=auto_bench.TINY, help="comma-separated names, as tools/auto_bench.py")
    ap.add_argument("--seconds", type=float, default=12.0, help="how long the serving loop runs")
    ap.add_argument("--gap", default="2x", help="idle gap after each request: '50ms', or '2x' stock's p50")
    ap.add_argument("--block", type=int, default=8, help="requests per block (auto, stock, auto, stock A/A...)")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of every session")
    ap.add_argument("--spinning", choices=("on", "off"), default="off",
                    help="ORT's pool threads spinning in every session (default off)")
    ap.add_argument("--json", default="", help="result file, or a folder for the default name")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if auto_bench.child_answered(args, child):
        return 0
    return auto_bench.serve_each("served_path", args, __file__, line)


if __name__ == "__main__":
    sys.exit(main())
