"""Render the README's result tables from the result files in ``benchmarks/results/``.

    python tools/readme_tables.py            # rewrite every marked section of README.md
    python tools/readme_tables.py --check    # exit 1 and print a diff when README.md is stale

A generated section sits between two marker comments; the begin marker names the result files it is
made from (relative to ``benchmarks/results/``), the end marker closes it:

    <!-- results:bench begin files=bench-resnet50+bert_encoder-2026-12-03.json -->
    ... generated, never edited by hand ...
    <!-- results:bench end -->

Everything between the markers is replaced; the markers stay. The files are named in the marker
rather than picked as "the newest bench-*.json" so that a result file committed for another purpose
(a before/after comparison of one model, a run on another machine) never silently replaces the
README's table: changing what the README shows is an edit of one marker line, reviewed like any
other. Kinds of section: ``bench`` (``ortfuse bench --json`` files: one row per model and ortfuse
configuration) and ``public`` (``ortfuse bench --suite public --json`` files: one row per model, a
column per configuration, with the packages and sha256 the models came from). The renderer reads
only the files (no ortfuse import), so the README says what the files say, not what today's code
would. ``--print KIND FILE`` renders one file to stdout, for a table of another machine's run:

    ortfuse bench --suite public --peer openvino --threads 2 --json results/
    python tools/readme_tables.py --print public results/bench-public-<date>.json
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path

from ortfuse.bench.peers import PEERS
from ortfuse.bench.sessions import RENAMED_CONFIGS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "benchmarks" / "results"

SECTION = re.compile(
    r"(?P<begin><!-- results:(?P<kind>[a-z_]+) begin(?P<args>[^>]*?)-->\n)"
    r"(?P<body>.*?)"
    r"(?P<end><!-- results:(?P=kind) end -->)",
    re.S,
)


# ---------------------------------------------------------------------------------------------- numbers


def ms(x: float) -> str:
    """A latency in ms with three significant digits and no exponent (163, 12.2, 1.37, 0.412)."""
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def ratio_range(ratio: float, per_repeat: list[float]) -> str:
    return f"{ratio:.3f} [{min(per_repeat):.3f}-{max(per_repeat):.3f}]"


def diff(d) -> str:
    if d is None:
        return "-"
    if isinstance(d, str):  # the bench writes a non-finite float as a string ("inf")
        return d
    return "0" if d == 0 else f"{d:.1e}"


# ---------------------------------------------------------------------------------------------- bench


def _config_label(name: str, row: dict) -> str:
    """`fusion="auto"` from the file's own description 'ortfuse fusion="auto"'; the name otherwise."""
    desc = row.get("description") or ""
    return f"`{desc.removeprefix('ortfuse ')}`" if desc.startswith("ortfuse ") else f"`{name}`"


def _fused(counts) -> str:
    if not counts:
        return "none"
    return ", ".join(f"{k}:{v}" for k, v in counts.items())


def _command(doc: dict) -> str:
    """The ``ortfuse bench`` command line that this file's protocol corresponds to."""
    prot = doc["protocol"]
    models = list(dict.fromkeys(res.get("zoo") or res["model"] for res in doc["results"]))
    batches = list(dict.fromkeys(str(res["batch"]) for res in doc["results"]))
    chosen = ["--suite", doc["suite"]] if doc.get("suite") else models
    parts = ["ortfuse bench", *chosen, "--batch", ",".join(batches)]
    if prot.get("runs") != "auto":
        parts += ["--runs", str(prot["runs"])]
    parts += ["--repeats", str(prot["repeats"])]
    if prot.get("warmup_passes_per_repeat", 2) != 2:
        parts += ["--warmup", str(prot["warmup_passes_per_repeat"])]
    configs = prot.get("configs") or []
    default = ["ort_disable_all", "ort_enable_all", "ortfuse_auto", ORTFUSE_TRUE, "ort_enable_all_b"]
    peers = {config: peer for peer, config in PEERS.items()}
    current = [_current(c) for c in configs]  # a file written before a configuration was renamed
    extra = current[len(default):]
    if extra and current[:len(default)] == default and all(c in peers for c in extra):
        for config in extra:
            parts += ["--peer", peers[config]]
    elif current and current != default:
        parts += ["--configs", ",".join(configs)]  # as the file names them (`ortfuse bench` reads former names)
    if prot.get("spinning"):
        parts += ["--spinning", "on"]
    if prot.get("gap_ms"):
        parts += ["--gap-ms", f"{prot['gap_ms']:g}"]
    if prot.get("block", 1) > 1:
        parts += ["--block", str(prot["block"]), "--settle-ms", f"{prot['settle_ms']:g}"]
    if isinstance(prot.get("intra_op_num_threads"), int) and prot["intra_op_num_threads"]:
        parts += ["--threads", str(prot["intra_op_num_threads"])]
    if prot.get("memory", "subprocess") != "subprocess":
        parts += ["--memory", prot["memory"]]
    if prot.get("quiet_threads") is False:
        parts += ["--quiet-threads", "off"]
    return " ".join(parts)


def _when_where(doc: dict) -> tuple[str, str, str]:
    """(date, cores, load and duration) of a run, as the run lines print them."""
    env = doc["environment"]
    date = str(env["date"]).replace("T", " ")[:16] + " UTC" if "+00:00" in str(env["date"]) else str(env["date"])
    cores = (
        f"{env['logical_cores']} logical cores ({env['physical_cores']} physical, {env['usable_cores']} usable)"
    )
    before = env.get("load_average_1_5_15")
    after = [res["load_average_after"][0] for res in doc["results"] if res.get("load_average_after")]
    load = f"load average {before[0]:.2f} before the run" if before else "load average not recorded"
    if after:
        load += f", {min(after):.2f}-{max(after):.2f} after each model"
    load += f", {doc['wall_s'] / 60:.1f} minutes" if doc.get("wall_s") else ""
    return date, cores, load


def _unit(prot: dict) -> str:
    """What one slot of a pass timed: a single run, or a block of runs after an idle settle."""
    if prot.get("block", 1) > 1:
        return (f"blocks of {prot['block']} back-to-back runs (each block after {prot['settle_ms']:g} ms idle and one "
                "untimed run)")
    return "single runs"


def _run_line(doc: dict, name: str) -> str:
    """One paragraph naming the machine, date, load, versions and protocol of the run."""
    env, prot = doc["environment"], doc["protocol"]
    v = env.get("versions", {})
    versions = ", ".join(
        f"{k} {v[k]}" for k in ("ortfuse", "onnxruntime", "onnxruntime-extensions", "onnx", "numba", "numpy") if k in v
    )
    date, cores, load = _when_where(doc)
    tune = [
        row.get("tune_s")
        for res in doc["results"]
        for row in res["configs"].values()
        if row.get("tune_s") is not None
    ]
    if tune and any(tune):
        measured = [t for t in tune if t]
        tune_txt = (
            f" `auto` decisions measured ahead by `ortfuse tune` ({min(measured):.0f}-{max(measured):.0f} s per "
            "model, outside the timings) and cached."
        )
    elif tune:
        tune_txt = " `auto` decisions were already cached (`ortfuse tune`)."
    else:
        tune_txt = ""
    runs = prot["runs"] if prot["runs"] != "auto" else "auto-sized"
    return (
        f"`{_command(doc)}` ([{name}](benchmarks/results/{name})): {date}, {env['cpu_model']}, {cores}, "
        f"Python {env.get('python', '?')}, {versions}; {load}. "
        f"{prot['warmup_passes_per_repeat']} warm-up + {runs} timed passes per repeat, {prot['repeats']} repeats, "
        f"{_unit(prot)} of every configuration interleaved, ORT spinning {'on' if prot.get('spinning') else 'off'}."
        f"{tune_txt}"
    )


def bench_rows(doc: dict) -> list[list[str]]:
    """One row per (model, batch, ortfuse configuration) of an ``ortfuse bench`` result file."""
    prot = doc["protocol"]
    stock = {prot.get("baseline"), prot.get("control"), prot.get("reference")}
    rows = []
    for res in doc["results"]:
        base = res["configs"][prot["baseline"]]
        ctrl = res.get("control")
        aa = ratio_range(ctrl["ratio"], ctrl["ratio_per_repeat"]) if ctrl else "n/a"
        for name, row in res["configs"].items():
            if name in stock:
                continue
            rows.append(
                [
                    res["model"],
                    str(res["batch"]),
                    ms(base["p50_ms"]),
                    _config_label(name, row),
                    ms(row["p50_ms"]),
                    ratio_range(row["ratio"], row["ratio_per_repeat"]),
                    aa,
                    row.get("verdict") or "",
                    diff(row.get("max_abs_diff")),
                    _fused(row.get("fused_ops")),
                ]
            )
    return rows


BENCH_HEADER = [
    "model",
    "batch",
    "stock ORT p50 ms",
    "ortfuse",
    "p50 ms",
    "p50 / stock [repeats]",
    "A/A control [repeats]",
    "verdict",
    "max abs diff",
    "fused ops",
]


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _notes(doc: dict) -> list[str]:
    out = []
    for res in doc["results"]:
        for name, row in res["configs"].items():
            out += [f"- {res['model']}, {name}: {w}" for w in row.get("warnings") or []]
        out += [f"- {res['model']}: {n}" for n in res.get("notes") or []]
    return out


def render_bench(docs: list[tuple[str, dict]]) -> str:
    parts = []
    for name, doc in docs:
        parts.append(_run_line(doc, name))
        parts.append(_markdown(BENCH_HEADER, bench_rows(doc)))
        notes = _notes(doc)
        if notes:
            parts.append("Notes written by the run:\n\n" + "\n".join(notes))
    parts.append(_legend(docs) + f" max abs diff = largest difference of any output from `{_reference(docs)}`.")
    return "\n\n".join(parts) + "\n"


def _reference(docs: list[tuple[str, dict]]) -> str:
    return docs[0][1]["protocol"].get("reference", "ort_disable_all") if docs else "ort_disable_all"


def _legend(docs: list[tuple[str, dict]]) -> str:
    baseline = docs[0][1]["protocol"].get("baseline", "ort_enable_all") if docs else "ort_enable_all"
    return (
        f"stock ORT = `{baseline}` (onnxruntime, all graph optimizations); p50 = median over repeats of each "
        f"repeat's median latency; p50 / stock = median over repeats of the same repeat's ratio [min-max]; "
        f"A/A control = a second stock session measured the same way, whose spread (made symmetric around 1) "
        f"is the noise band; verdict `faster`/`slower` only when every repeat's ratio lies outside it, "
        f"`~ noise` otherwise;"
    )


# ---------------------------------------------------------------------------------------------- public

PEER_LABELS = {"openvino_f32": "OpenVINO f32", "ort_transformers": "ORT transformer optimizer"}
ORTFUSE_TRUE = "ortfuse_fused"  # the configuration of fusion=True, whose numerics the table shows


def _current(config: str) -> str:
    """A configuration's current name (files written before a rename name it as it was then)."""
    return RENAMED_CONFIGS.get(config, config)


def _label(name: str, row: dict) -> str:
    return PEER_LABELS.get(name) or _config_label(name, row)


def _shape(shape: list[int]) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


def _origins(doc: dict) -> str:
    """The packages the models came from, each model file with the start of its sha256."""
    by_package: dict[str, list[str]] = {}
    for res in doc["results"]:
        pub = res.get("public")
        if pub:
            files = by_package.setdefault(f"{pub['package']} {pub['version']}", [])
            entry = f"`{pub['member'].rsplit('/', 1)[-1]}` (sha256 {pub['sha256'][:12]}...)"
            if entry not in files:
                files.append(entry)
    return "; ".join(f"{package}: {', '.join(files)}" for package, files in by_package.items())


def _public_run_line(doc: dict, name: str) -> str:
    env, prot = doc["environment"], doc["protocol"]
    v = env.get("versions", {})
    versions = ", ".join(f"{k} {v[k]}" for k in ("onnxruntime", "openvino", "onnxruntime-extensions", "onnx", "numba",
                                                  "numpy", "ortfuse") if v.get(k, "not installed") != "not installed")
    date, cores, load = _when_where(doc)
    isa = f" ({', '.join(env['isa_features'])})" if env.get("isa_features") else ""
    runs = prot["runs"] if prot["runs"] != "auto" else "auto-sized"
    threads = prot.get("intra_op_num_threads")
    source = env.get("ortfuse_source") or {}
    if source.get("git_commit"):
        changed = f" with {len(source['modified'])} modified file(s)" if source.get("modified") else ""
        versions += f" (git {source['git_commit'][:10]}{changed})"
    return (
        f"- Command: `{_command(doc)} --json benchmarks/results/` ([{name}](benchmarks/results/{name})).\n"
        f"- Machine: {env['cpu_model']}{isa}, {cores}, {env.get('platform', '')}; {load}.\n"
        f"- Versions: {versions}, Python {env.get('python', '?')}.\n"
        f"- Models: {_origins(doc)}.\n"
        f"- Protocol: {prot['warmup_passes_per_repeat']} warm-up + {runs} timed passes per repeat, {prot['repeats']} "
        f"repeats, {_unit(prot)} of every configuration interleaved, batch 1, intra-op threads {threads}, ORT "
        f"spinning {'on' if prot.get('spinning') else 'off'}, seeded standard-normal inputs at each model's "
        f"input shape{_told_dims(doc)}; {date}."
    )


def _told_dims(doc: dict) -> str:
    """How the ortfuse sessions were told the input size, when the result file records it."""
    if not any(len(r.get("ortfuse_dims") or {}) > 1 for r in doc.get("results", [])):
        return ""
    return (", which the ortfuse sessions are told (`ortfuse.tune_dims` with the dims the model declares dynamic: "
            "the layout step times its native convs at that size; the plan still takes any size)")


def public_columns(doc: dict) -> list[str]:
    """The configurations shown as columns: every one but the stock sessions, ``fusion=True`` first,
    the others in the file's order."""
    prot = doc["protocol"]
    stock = {prot.get("baseline"), prot.get("control"), prot.get("reference")}
    return sorted((c for c in prot["configs"] if c not in stock), key=lambda c: _current(c) != ORTFUSE_TRUE)


def _rel(row: dict | None) -> str:
    return diff(row.get("max_rel_diff")) if row else "-"


def public_rows(doc: dict) -> list[list[str]]:
    """One row per (model, batch) of a ``--suite public`` result file."""
    prot = doc["protocol"]
    rows = []
    for res in doc["results"]:
        base = res["configs"][prot["baseline"]]
        ctrl = res.get("control")
        pub = res.get("public") or {}
        origin = f" ({pub['package']} {pub['version']})" if pub else ""
        cells = [f"`{res['model']}`{origin}",
                 ", ".join(f"{k} {_shape(v['shape'])}" for k, v in res["inputs"].items()),
                 ms(base["p50_ms"])]
        for name in public_columns(doc):
            row = res["configs"].get(name)
            cells.append(f"{ratio_range(row['ratio'], row['ratio_per_repeat'])} {row.get('verdict') or ''}".rstrip()
                         if row else "-")
        cells.append(ratio_range(ctrl["ratio"], ctrl["ratio_per_repeat"]) if ctrl else "n/a")
        true = next((row for c, row in res["configs"].items() if _current(c) == ORTFUSE_TRUE), None)
        cells.append(f"{_rel(true)} / {_rel(base)}")
        fused = (true or {}).get("fused_ops")
        cells.append(_fused(fused))
        rows.append(cells)
    return rows


def public_header(doc: dict) -> list[str]:
    labels = [_label(c, doc["results"][0]["configs"][c]) if doc["results"] else f"`{c}`"
              for c in public_columns(doc)]
    return ["model (package)", "input", "stock ORT p50 ms", *[f"{label} / stock [repeats]" for label in labels],
            "A/A control [repeats]", "max rel diff: `fusion=True` / stock ORT", "fused ops (`fusion=True`)"]


def render_public(docs: list[tuple[str, dict]]) -> str:
    parts = []
    for name, doc in docs:
        parts.append(_public_run_line(doc, name))
        parts.append(_markdown(public_header(doc), public_rows(doc)))
        skipped = doc.get("skipped") or []
        if skipped:
            parts.append("Not measured in this run:\n\n" + "\n".join(f"- {s['reason']}" for s in skipped))
        notes = _notes(doc)
        if notes:
            parts.append("Notes written by the run:\n\n" + "\n".join(notes))
    parts.append(
        _legend(docs) + f" max rel diff = largest difference of any output from `{_reference(docs)}` (stock "
        "ORT, graph optimizations off) relative to that output's largest magnitude, for `fusion=True` and for "
        "stock ORT with all optimizations."
    )
    return "\n\n".join(parts) + "\n"


RENDERERS = {"bench": render_bench, "public": render_public}


# ---------------------------------------------------------------------------------------------- README


def _files(args: str) -> list[str]:
    m = re.search(r"files=(\S+)", args)
    if not m:
        raise ValueError(f"results marker without files=...: {args.strip()!r}")
    return [f for f in m.group(1).split(",") if f]


def render_section(kind: str, args: str, results: Path) -> str:
    if kind not in RENDERERS:
        raise ValueError(f"unknown results section kind {kind!r} (known: {', '.join(RENDERERS)})")
    docs = []
    for name in _files(args):
        with open(results / name) as f:
            docs.append((name, json.load(f)))
    return RENDERERS[kind](docs)


def update(text: str, results: Path = RESULTS) -> str:
    """``text`` with every marked section replaced by its rendering (a blank line after the begin
    marker and before the end marker, so that markdown tables are not glued to the comments)."""
    if not SECTION.search(text):
        raise ValueError("no <!-- results:KIND begin files=... --> ... <!-- results:KIND end --> section")

    def sub(m: re.Match) -> str:
        body = render_section(m.group("kind"), m.group("args"), results)
        return f"{m.group('begin')}\n{body}\n{m.group('end')}"

    return SECTION.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff when README is not up to date")
    parser.add_argument("--readme", type=Path, default=README, help="the markdown file (default README.md)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the result files")
    parser.add_argument("--print", nargs=2, metavar=("KIND", "FILE"),
                        help="render one result file as a section of KIND (bench, public) to stdout, README untouched")
    args = parser.parse_args(argv)
    if args.print:
        kind, file = args.print
        path = Path(file).resolve()
        print(render_section(kind, f" files={path.name} ", path.parent), end="")
        return 0
    old = args.readme.read_text()
    new = update(old, args.results)
    if args.check:
        if new == old:
            return 0
        sys.stdout.writelines(
            difflib.unified_diff(
                old.splitlines(True), new.splitlines(True), f"{args.readme} (as is)", f"{args.readme} (from results)"
            )
        )
        print(f"{args.readme} differs from its result files: run python tools/readme_tables.py", file=sys.stderr)
        return 1
    if new != old:
        args.readme.write_text(new)
        print(f"rewrote {args.readme}")
    else:
        print(f"{args.readme} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
