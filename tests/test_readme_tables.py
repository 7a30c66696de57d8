"""The README's generated result sections equal what tools/readme_tables.py renders from the files in
benchmarks/results/ (a hand edit of a figure fails here), and the renderer gives the expected rows
for a small synthetic ``ortfuse bench`` file."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tables():
    if "readme_tables" not in sys.modules:
        spec = importlib.util.spec_from_file_location("readme_tables", ROOT / "tools" / "readme_tables.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["readme_tables"] = module
    return sys.modules["readme_tables"]


def _repeats(p50s):
    return [[x, x] for x in p50s]  # two runs per repeat; only the per-repeat medians matter here


def _config(description, p50, rr, verdict="", fused=None, diff=1e-7, tune_s=None):
    return {
        "description": description,
        "p50_ms": p50,
        "p50_ms_per_repeat": [p50] * len(rr),
        "ratio_per_repeat": rr,
        "ratio": sorted(rr)[len(rr) // 2],
        "verdict": verdict,
        "max_abs_diff": diff,
        "fused_ops": fused,
        "tune_s": tune_s,
        "warnings": [],
        "latencies_ms": _repeats([p50] * len(rr)),
    }


def _synthetic() -> dict:
    ctrl_rr = [0.99, 1.0, 1.02]
    stock = "stock onnxruntime, all graph optimizations"

    def result(model, base, auto, numba, auto_verdict, numba_verdict, fused, tune_s):
        return {
            "model": model,
            "zoo": model,
            "batch": 1,
            "load_average_after": [1.5, 1.0, 1.0],
            "control": {"config": "ort_enable_all_b", "ratio": 1.0, "ratio_per_repeat": ctrl_rr},
            "notes": [],
            "configs": {
                "ort_enable_all": _config(stock, base, [1.0, 1.0, 1.0], tune_s=None),
                "ortfuse_auto": _config(
                    'ortfuse fusion="auto"', base * auto[1], auto, auto_verdict, fused, tune_s=tune_s
                ),
                "ortfuse_numba": _config("ortfuse fusion=True", base * numba[1], numba, numba_verdict, fused),
                "ort_enable_all_b": _config("A/A control", base, ctrl_rr),
            },
        }

    return {
        "schema": 1,
        "environment": {
            "date": "2026-12-03T10:00:00+00:00",
            "cpu_model": "Test CPU",
            "logical_cores": 4,
            "physical_cores": 2,
            "usable_cores": 4,
            "load_average_1_5_15": [0.25, 0.5, 0.5],
            "python": "3.11.7",
            "versions": {"ortfuse": "0.1.0", "onnxruntime": "1.32.0", "onnx": "1.23.2", "numba": "0.68.1",
                         "numpy": "2.4.6", "onnxruntime-extensions": "0.15.2"},
        },
        "protocol": {
            "configs": ["ort_enable_all", "ortfuse_auto", "ortfuse_numba", "ort_enable_all_b"],
            "baseline": "ort_enable_all",
            "control": "ort_enable_all_b",
            "reference": "ort_disable_all",
            "runs": 20,
            "repeats": 3,
            "warmup_passes_per_repeat": 2,
            "spinning": False,
            "gap_ms": 0.0,
            "intra_op_num_threads": "ORT default",
            "memory": "off",
            "quiet_threads": True,
        },
        "wall_s": 90.0,
        "results": [
            result("net_a", 12.0, [0.70, 0.75, 0.80], [0.90, 0.95, 0.97], "faster", "faster", {"hardswish": 3}, 12.0),
            result("net_b", 150.0, [0.98, 1.0, 1.01], [1.10, 1.12, 1.20], "~ noise", "slower", {}, 30.0),
        ],
    }


def test_synthetic_bench_file_gives_one_row_per_model_and_ortfuse_config():
    rows = [" | ".join(row) for row in _tables().bench_rows(_synthetic())]
    assert rows == [
        'net_a | 1 | 12.0 | `fusion="auto"` | 9.00 | 0.750 [0.700-0.800] | 1.000 [0.990-1.020] | faster | 1.0e-07 '
        "| hardswish:3",
        "net_a | 1 | 12.0 | `fusion=True` | 11.4 | 0.950 [0.900-0.970] | 1.000 [0.990-1.020] | faster | 1.0e-07 "
        "| hardswish:3",
        'net_b | 1 | 150 | `fusion="auto"` | 150 | 1.000 [0.980-1.010] | 1.000 [0.990-1.020] | ~ noise | 1.0e-07 '
        "| none",
        "net_b | 1 | 150 | `fusion=True` | 168 | 1.120 [1.100-1.200] | 1.000 [0.990-1.020] | slower | 1.0e-07 "
        "| none",
    ]


def test_synthetic_bench_section_names_machine_date_load_versions_and_command(tmp_path):
    tables = _tables()
    (tmp_path / "bench-x.json").write_text(json.dumps(_synthetic()))
    text = tables.render_section("bench", " files=bench-x.json ", tmp_path)
    first = text.split("\n\n", 1)[0]
    assert first.startswith(
        "`ortfuse bench net_a net_b --batch 1 --runs 20 --repeats 3 "
        "--configs ort_enable_all,ortfuse_auto,ortfuse_numba,ort_enable_all_b --memory off`"
    )
    for part in ("2026-12-03 10:00 UTC", "Test CPU, 4 logical cores (2 physical, 4 usable)",
                 "onnxruntime 1.32.0", "numba 0.68.1", "load average 0.25 before the run, 1.50-1.50 after",
                 "1.5 minutes", "3 repeats", "measured ahead by `ortfuse tune` (12-30 s"):
        assert part in first, part
    assert "| net_b | 1 | 150 | `fusion=True` | 168 | 1.120 [1.100-1.200] |" in text


def test_check_fails_on_a_stale_section_and_passes_after_rewriting(tmp_path, capsys):
    tables = _tables()
    results = tmp_path / "results"
    results.mkdir()
    (results / "bench-x.json").write_text(json.dumps(_synthetic()))
    readme = tmp_path / "README.md"
    before, after = "# t\n\nprose\n\n", "\nmore prose\n"
    hand = "| net_a | 1 | 12.3 | hand-written 0.5 |\n"
    marked = f"<!-- results:bench begin files=bench-x.json -->\n{hand}<!-- results:bench end -->"
    readme.write_text(before + marked + after)
    argv = ["--readme", str(readme), "--results", str(results)]
    assert tables.main([*argv, "--check"]) == 1
    assert "-| net_a | 1 | 12.3 | hand-written 0.5 |" in capsys.readouterr().out
    assert tables.main(argv) == 0
    text = readme.read_text()
    assert text.startswith(before) and text.endswith(after) and hand not in text
    assert "| net_a | 1 | 12.0 | `fusion=True` | 11.4 |" in text
    assert tables.main([*argv, "--check"]) == 0


def test_marker_without_files_or_of_unknown_kind_is_an_error(tmp_path):
    tables = _tables()
    with pytest.raises(ValueError, match="files="):
        tables.update("<!-- results:bench begin -->\n<!-- results:bench end -->\n", tmp_path)
    with pytest.raises(ValueError, match="unknown"):
        tables.update("<!-- results:plot begin files=a.json -->\n<!-- results:plot end -->\n", tmp_path)
    with pytest.raises(ValueError, match="no <!-- results"):
        tables.update("# no markers\n", tmp_path)


def test_readme_sections_equal_their_rendering_from_benchmarks_results():
    tables = _tables()
    readme = (ROOT / "README.md").read_text()
    sections = list(tables.SECTION.finditer(readme))
    assert [m.group("kind") for m in sections] == ["bench"]  # the README's ortfuse bench table is generated
    for m in sections:
        for name in tables._files(m.group("args")):
            assert (tables.RESULTS / name).is_file(), name
        rendered = tables.render_section(m.group("kind"), m.group("args"), tables.RESULTS)
        assert m.group("body") == "\n" + rendered + "\n", (
            "README.md's generated section is stale or hand-edited: run python tools/readme_tables.py"
        )
