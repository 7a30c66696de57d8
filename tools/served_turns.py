"""A serving loop alone, for ``fusion="auto"`` while it tunes and for stock ORT, each session in a
process of its own: the processes take turns of ``--phase`` seconds (auto, stock, auto, a second
stock session as the A/A control, ...), and a process whose turn ended is stopped (SIGSTOP) between
two of its requests until its next turn. Its ORT pool threads, spinning or asleep, stand still
meanwhile and go on as in a loop that never paused, so no session's threads run into another's turn.

    python tools/served_turns.py --models silero_vad_16k_op15[,ppocr_mobile_v2_cls,...] [--spinning on|off]
                                 [--phase 0.25] [--gap 2x] [--threads 2] [--served 30] [--after-served 200]
                                 [--wait 300] [--passes 1] [--trace] [--json benchmarks/results/]

Why processes: ``tools/auto_bench.py --alone`` serves its blocks from one process, where with
ORT's default spinning the last block's session's pool threads spin on for tens of milliseconds
into the next block, and an idle settle that waits them out leaves the next block's first requests
cold; neither happens on a server that serves one model without pause.

The auto process holds its tuning through its stopped turns as through one long served run (the
tuning process stopped: it gets the auto loop's gaps only, as in ``auto_bench --alone``, so its
wall time to the plan is about twice a loop's of its own; ``time_to_plan`` reports both the wall
seconds and the seconds of auto's turns). Models, feeds, options, the empty cache per pass and the
gap are ``tools/auto_bench.py``'s (the gap from a throwaway stock session in the stock process).
Requests arrive an idle gap after the previous one ended, the first of a turn a gap after the turn
begins (the loop goes on where it stopped); a request's latency runs from its arrival to its end.
Stock's requests are labelled by auto's state at the end of auto's last turn. Verdicts as
``auto_bench``'s ``p50_tuning`` and ``p99_tuning`` (auto's requests while it recorded and tuned over
both stock sessions' in the same span, pooled); the requests are also grouped by the tuning process
in the gap before them, by their place in the turn (``by_place``: a cold start of a turn would show
in its first milliseconds) and by how many requests ago the tuning process last ran
(``by_distance``: how far its work's cost reaches, split into the C run, the wake-up and the Python
around the run). ``--trace`` keeps every request (arrival, session, state, ms, the tuning process in
the gap before, wake-up ms, the C run's ms: ORT's run of its C session, timed by the same proxy in
every process) and every turn in the JSON file, on a clock from ``clock_origin_s`` (a
``time.perf_counter()`` reading: CLOCK_MONOTONIC on Linux, as ``perf record -k mono`` stamps events).
After the tuning every session serves ``--after-served`` more requests (auto on its
final plan: a session that keeps nothing against stock, in the same turns).
"""

from __future__ import annotations

import argparse
import bisect
import datetime as _dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import auto_bench  # noqa: E402
from served_path import TimedC  # noqa: E402
from served_requests import (  # noqa: E402
    by_gap,
    gap_state,
    latency_summary,
    percentile,
    phase,
    slow_by_step,
    tuning_ratios,
)

ROLES = ("stock", "stock_aa", "auto")  # the order the processes are made in: auto, made last, starts cold
TURNS = ("auto", "stock", "auto", "stock_aa")
ANSWER = "TURN "  # a worker's answers on its stdout start with this
PLACES = (0.005, 0.08)  # by_place's bounds: a turn's first 5 ms, up to 80 ms, the rest (seconds)


# ------------------------------------------------------------------------------------------- worker


def worker(args) -> int:
    """One session's serving loop, a turn per command read from stdin, a JSON line answered per turn."""
    import onnxruntime as ort

    import ortfuse
    from ortfuse.foundation.session_options import measuring_options
    from ortfuse.ir.model_args import parse_dims

    path, feeds = auto_bench.model_and_feeds(args.model, parse_dims(args.dim))
    role, cpu = args.worker, ["CPUExecutionProvider"]

    def options():
        return measuring_options("ORT_ENABLE_ALL", threads=args.threads, spinning=args.spinning == "on")

    ready: dict = {"role": role}
    if role == "stock":  # stock's p50 for the gap, from a throwaway session (as auto_bench)
        ready["p50_ms"] = auto_bench.cold_stock_p50_ms(path, options(), feeds)
    if role == "auto":
        session = ortfuse.InferenceSession(path, options(), providers=cpu, fusion="auto")
    else:
        session = ort.InferenceSession(path, options(), providers=cpu)
    live = getattr(session, "_ortfuse_live", None)
    served = live.served if live is not None else None
    marks: dict = {}
    statuses = [session.fusion_status] if role == "auto" else []
    lat: dict[str, list[float]] = {}
    trace: list = []
    turns: list[tuple[float, float, int]] = []
    held = False
    _answer(ready)
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("finish"):
            done = {"role": role, "lat": lat, "trace": trace, "turns": turns, "statuses": statuses}
            if role == "auto":
                report = session.fusion_report
                done.update(time_to_plan=session.time_to_plan, notes=report.notes, fused=len(report.fused),
                            timeline=[(event, t) for event, t in getattr(live, "timeline", [])])
            Path(command["finish"]).write_text(json.dumps(done))
            _answer({"written": command["finish"]})
            return 0
        start = time.perf_counter()
        if held and served is not None:  # the tuning goes on in this turn's gaps
            served.end()
            held = False
        until, gap, n = start + command["seconds"], command["gap_s"], 0
        # the loop goes on where it stopped: the last turn's last request ended, the process was
        # continued as after any served run (above), and the next request arrives a gap later
        arrival = start + gap
        while True:
            label = command["label"]
            if role == "auto":  # read in the gap, before the request arrives: not part of its latency
                status = session.fusion_status
                if status != statuses[-1]:
                    statuses.append(status)
                label = phase(status)
            time.sleep(max(0.0, arrival - time.perf_counter()))
            woke = time.perf_counter()
            process = gap_state(served)
            if not isinstance(session._sess, TimedC):  # the same proxy in every process (after a swap: the new one)
                session._sess = TimedC(session._sess, "c", marks)
            session.run(None, feeds[n % len(feeds)])
            end = time.perf_counter()
            ms = (end - arrival) * 1e3
            lat.setdefault(f"{role}_{label}", []).append(ms)
            c_start, c_end = marks["c"]
            trace.append((round(arrival, 6), role, label, round(ms, 4), process, round((woke - arrival) * 1e3, 4),
                          round((c_end - c_start) * 1e3, 4)))
            n += 1
            arrival = end + gap
            if arrival >= until:
                break
        if served is not None:  # held through the turns of the other processes, as through a long served run
            served.begin()
            held = True
        turns.append((round(start, 6), round(time.perf_counter(), 6), n))
        answer: dict = {"n": n}
        if role == "auto":
            answer.update(phase=phase(session.fusion_status), tuned=session.wait_tuned(0))
        _answer(answer)
    return 1


def _answer(message: dict) -> None:
    """One answer to the turns' process, on a line of its own (other output on stdout is skipped)."""
    print(ANSWER + json.dumps(message), flush=True)


# --------------------------------------------------------------------------------------------- turns


class _Process:
    """A worker process: commands on its stdin, one JSON line answered on its stdout per command."""

    def __init__(self, role: str, name: str, args, env: dict) -> None:
        argv = [sys.executable, __file__, "--worker", role, "--model", name, "--threads", str(args.threads),
                "--spinning", args.spinning] + [f"--dim={d}" for d in args.dim]
        self.role = role
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1)

    def ask(self, command: dict | None = None) -> dict:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None  # both piped
        try:
            if command is not None:
                stdin.write(json.dumps(command) + "\n")
                stdin.flush()
            while line := stdout.readline():
                if line.startswith(ANSWER):
                    return json.loads(line[len(ANSWER):])
        except BrokenPipeError:
            pass
        raise RuntimeError(f"the {self.role} process ended (exit code {self.proc.wait()})")

    def signal(self, name: str) -> None:
        os.kill(self.proc.pid, getattr(signal, name))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.signal("SIGCONT")
            self.proc.kill()
        self.proc.wait()


def run_turns(name: str, args) -> dict:
    """One pass: the three processes (a new empty ``ORTFUSE_CACHE_DIR``), their turns until auto has
    served ``--served`` requests and tuned, and every session has served ``--after-served`` requests
    after that (or ``--wait`` seconds passed since the ``--served``-th), and what they served."""
    from ortfuse.bench.environment import environment

    folder = tempfile.mkdtemp(prefix="ortfuse-served-turns-")
    os.mkdir(os.path.join(folder, "cache"), 0o700)
    env = {**os.environ, **auto_bench.machine_caches(), "ORTFUSE_CACHE_DIR": os.path.join(folder, "cache")}
    env.pop("ORTFUSE_TUNE", None)
    env_before = environment()
    processes: dict[str, _Process] = {}
    try:
        gap_s = None
        for role in ROLES:
            processes[role] = _Process(role, name, args, env)
            ready = processes[role].ask()
            if "p50_ms" in ready:
                gap_s = auto_bench._gap_s(args.gap, ready["p50_ms"])
            processes[role].signal("SIGSTOP")
        label, served, reached_at, tuned, turn = "recording", 0, None, False, 0
        after = dict.fromkeys(ROLES, 0)  # requests served after the tuning ended, per session
        while True:
            process = processes[TURNS[turn % len(TURNS)]]
            turn += 1
            process.signal("SIGCONT")
            answer = process.ask({"seconds": args.phase, "gap_s": gap_s, "label": label})
            process.signal("SIGSTOP")
            if process.role == "auto":
                label, tuned = answer["phase"], answer["tuned"]
                served += answer["n"]
                if served >= args.served and reached_at is None:
                    reached_at = time.perf_counter()
            after[process.role] += answer["n"] if label == "after" else 0
            if reached_at is not None and ((tuned and min(after.values()) >= args.after_served)
                                           or time.perf_counter() - reached_at > args.wait):
                break
        done = {}
        for role, process in processes.items():
            process.signal("SIGCONT")
            written = process.ask({"finish": os.path.join(folder, f"{role}.json")})["written"]
            done[role] = json.loads(Path(written).read_text())
    finally:
        for process in processes.values():
            process.close()
        shutil.rmtree(folder, ignore_errors=True)
    return summary(name, args, done, gap_s, tuned, env_before, environment())


def by_place(trace: list, turns: list, stock_p50_ms: float | None, slow: float = 4.0) -> dict:
    """Requests served while auto recorded and tuned, by session, their place in the turn (``PLACES``:
    seconds since the turn began) and, for auto, the tuning process in the gap before: how many, their
    p50 (ms), the p50 of their C run (ORT's run of the C session: what the Python around it does not
    reach) and the share over ``slow`` x stock's p50."""
    starts = sorted(t[0] for t in turns)
    groups: dict[str, list[tuple[float, float]]] = {}
    for arrival, role, state, ms, process, _, c_run in trace:
        if state not in ("recording", "tuning"):
            continue
        since = arrival - starts[max(0, bisect.bisect_right(starts, arrival) - 1)]
        place = next((f"<{round(b * 1e3)}ms" for b in PLACES if since < b), "rest")
        key = f"{'stock' if role.startswith('stock') else role}_{place}" + (f"_{process}" if role == "auto" else "")
        groups.setdefault(key, []).append((ms, c_run))
    out = {}
    for key, rows in sorted(groups.items()):
        ms_list = [ms for ms, _ in rows]
        out[key] = {"n": len(rows), "p50_ms": percentile(ms_list, 0.5),
                    "c_run_p50_ms": percentile([c for _, c in rows], 0.5),
                    "slow_share": round(sum(x > slow * stock_p50_ms for x in ms_list) / len(rows), 4)
                    if stock_p50_ms else None}
    return out


DISTANCES = (0, 1, 2, 4, 16, 32)  # by_distance's upper bounds: requests since the process last ran


def by_distance(trace: list) -> dict:
    """Auto's requests while it recorded and tuned by how many requests ago the tuning process last ran
    in a gap (0: the request right after such a gap; "more": further, or across other turns; "never":
    before its first), against both stock sessions' requests in the same span: how many, and the p50
    of the request (ms), of its C run, of the serving thread's wake-up and of the Python around the C
    run (the rest of the request)."""
    groups: dict[str, list[tuple[float, float, float]]] = {}
    since = None
    for _, role, state, ms, process, wake, c_run in trace:
        if state not in ("recording", "tuning"):
            continue
        if role != "auto":
            key = "stock"
        elif process == "running":
            since, key = 0, "0"
        elif since is None:
            key = "never"
        else:
            since += 1
            key = next((f"<={b}" for b in DISTANCES[1:] if since <= b), "more")
        groups.setdefault(key, []).append((ms, c_run, wake))
    out = {}
    for key, rows in groups.items():
        python = percentile([r[0] - r[1] - r[2] for r in rows], 0.5)
        out[key] = {"n": len(rows), "p50_ms": percentile([r[0] for r in rows], 0.5),
                    "c_run_p50_ms": percentile([r[1] for r in rows], 0.5),
                    "wake_p50_ms": percentile([r[2] for r in rows], 0.5),
                    "python_p50_ms": round(python, 4) if python is not None else None}
    return out


def plan_turn_seconds(turns: list, first: float, seconds: float | None) -> float | None:
    """Seconds of auto's turns from ``first`` (its first served run) until ``seconds`` after it."""
    if seconds is None:
        return None
    end = first + seconds
    return round(sum(max(0.0, min(b, end) - max(a, first)) for a, b, _ in turns), 3)


def summary(name: str, args, done: dict, gap_s: float | None, tuned: bool, env_before: dict, env_after: dict) -> dict:
    auto = done["auto"]
    lat = {k: v for d in done.values() for k, v in d["lat"].items()}
    trace = sorted((row for d in done.values() for row in d["trace"]), key=lambda row: row[0])
    turns = sorted((tuple(t) + (role,) for role, d in done.items() for t in d["turns"]), key=lambda t: t[0])
    started = turns[0][0]
    relative = [(round(a - started, 4), *rest) for a, *rest in trace]
    timeline = [(event, round(t - started, 4)) for event, t in auto.get("timeline", [])]
    ratios = tuning_ratios(lat)
    plan = auto.get("time_to_plan") or {}
    auto_turns = [t[:3] for t in turns if t[3] == "auto"]
    if plan:
        plan = {**plan, "auto_turn_seconds": plan_turn_seconds(auto_turns, auto_turns[0][0], plan.get("seconds"))}
    verdicts = {"tuned": tuned,
                "p99_tuning": ratios["p99"] <= auto_bench.P99_LIMIT if ratios["p99"] else None,
                "p50_tuning": ratios["p50"] <= auto_bench.P50_LIMIT if ratios["p50"] else None}
    result = {"model": name, "gap_ms": round(gap_s * 1e3, 3) if gap_s else None, "phase_s": args.phase,
              "spinning": args.spinning, "turns": len(turns), "statuses": auto["statuses"],
              "notes": auto.get("notes"), "fused": auto.get("fused"), "time_to_plan": plan,
              "tuning_timeline": timeline, "during_tuning": ratios,
              "summary": {k: latency_summary(v) for k, v in sorted(lat.items())},
              "by_gap": by_gap(relative), "by_place": by_place(trace, turns, ratios["stock_p50_ms"]),
              "by_distance": by_distance(trace),
              "slow_by_step": [{k: v for k, v in row.items() if k != "slow_ms"}
                               for row in slow_by_step(relative, timeline, ratios["stock_p50_ms"])],
              "verdicts": verdicts, "environment": env_before,
              "load_average_after": env_after.get("load_average_1_5_15")}
    if args.trace:
        result["clock_origin_s"] = started
        result["served_trace"] = relative
        result["turn_trace"] = [(round(a - started, 4), round(b - started, 4), n, role) for a, b, n, role in turns]
    return result


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']}: FAILED\n{r['error']}"
    d, plan = r["during_tuning"], r["time_to_plan"] or {}
    return (f"{r['model']}: gap {r['gap_ms']} ms, {r['turns']} turns of {r['phase_s']} s, spinning {r['spinning']}; "
            f"final: {r['statuses'][-1]}\n"
            f"  time to plan: {plan.get('plan')} plan {plan.get('seconds')} s after the first served run "
            f"({plan.get('auto_turn_seconds')} s of auto's turns; the tuning process used "
            f"{plan.get('child_cpu_s')} CPU s)\n"
            f"  while tuning: auto / stock p50 {d['p50']} (A/A {d['p50_aa']}), p99 {d['p99']} (A/A {d['p99_aa']})\n"
            f"  by the tuning process in the gap before: "
            + ", ".join(f"{k} n={g['n']} {g['p50_ms']:.3f} ms" for k, g in r["by_gap"].items()) + "\n"
            "  by requests since the process last ran (p50 ms; C run): "
            + ", ".join(f"{k} n={g['n']} {g['p50_ms']:.3f} ({g['c_run_p50_ms']:.3f})"
                        for k, g in r["by_distance"].items()) + "\n"
            f"  verdicts: {r['verdicts']}")


def pooled(name: str, passes: list[dict]) -> dict:
    """The passes of one model together: medians of the p50 and p99 ratios, each pass's beside them."""
    ok = [r for r in passes if "error" not in r]
    if not ok:
        return {"model": name, "passes": len(passes), "error": "every pass failed"}
    out: dict = {"model": name, "passes": len(passes), "failed": len(passes) - len(ok)}
    verdicts: dict = {"tuned": all(r["verdicts"]["tuned"] for r in ok)}
    for key, limit in (("p50", auto_bench.P50_LIMIT), ("p99", auto_bench.P99_LIMIT)):
        values = [r["during_tuning"][key] for r in ok if r["during_tuning"][key] is not None]
        median = round(statistics.median(values), 4) if values else None
        out[f"{key}_tuning_over_stock"] = {"median": median, "per_pass": values,
                                           "aa_per_pass": [r["during_tuning"][f"{key}_aa"] for r in ok]}
        verdicts[f"{key}_tuning"] = median <= limit if median is not None else None
    out["time_to_plan"] = [{k: (r["time_to_plan"] or {}).get(k) for k in ("plan", "seconds", "auto_turn_seconds")}
                           for r in ok]
    out["verdicts"] = verdicts
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="silero_vad_16k_op15", help="comma-separated models, as auto_bench's")
    ap.add_argument("--dim", action="append", default=[], help="NAME=N: a dynamic dim of a file's feeds")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads of every session (0: ORT's default)")
    ap.add_argument("--spinning", choices=("on", "off"), default="on",
                    help="ORT's pool threads spinning in every session (default on: ORT's own default)")
    ap.add_argument("--gap", default="2x", help="idle gap after each served request: '50ms', or '2x' stock's p50")
    ap.add_argument("--phase", type=float, default=0.25, help="seconds per turn")
    ap.add_argument("--served", type=int, default=30, help="auto's served requests before the tuning is waited for")
    ap.add_argument("--after-served", type=int, default=200,
                    help="requests each session serves after the tuning ended (auto on its final plan)")
    ap.add_argument("--wait", type=float, default=300.0, help="seconds to wait for the tuning after --served")
    ap.add_argument("--passes", type=int, default=1, help="fresh processes (empty caches) per model")
    ap.add_argument("--trace", action="store_true", help="keep every request and turn in the JSON file")
    ap.add_argument("--json", default="", help="result file, or a folder for the default name")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    print(f"ortfuse from {auto_bench.checkout()}", flush=True)
    names = [n for n in args.models.split(",") if n]
    results, pools = auto_bench.run_passes(names, args.passes, lambda name: run_turns(name, args), _line, pooled,
                                           lambda r: f"{r['model']} pooled: {r}")
    if args.json:
        from ortfuse.bench.output import save_result

        stem = f"served_turns-{'+'.join(map(auto_bench.label, names))}-{_dt.date.today().isoformat()}"
        doc = {"tool": "served_turns", "ortfuse_from": auto_bench.checkout(), "settings": vars(args),
               "results": results, "pooled": pools}
        print(f"wrote {save_result(doc, args.json, stem, compact=True)}")
    judged = pools if pools else results
    ok = all("error" not in r and all(v is not False for v in r["verdicts"].values()) for r in judged)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
