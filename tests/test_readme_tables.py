"""The README's generated result sections equal what tools/readme_tables.py renders from the files in
benchmarks/results/ (a hand edit of a figure fails here), and the renderer gives the expected rows
for a small synthetic ``ortfuse bench`` file."""

from __future__ import annotations

import json
import pathlib

import pytest
import tool_modules

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tables():
    return tool_modules.load("readme_tables")


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


def _synthetic_public() -> dict:
    """A ``--suite public --peer openvino`` file: two models, one skipped."""
    doc = _synthetic()
    doc["suite"] = "public"
    doc["environment"]["isa_features"] = ["avx2", "fma"]
    doc["environment"]["versions"]["openvino"] = "2026.4.1"
    doc["environment"]["ortfuse_source"] = {"git_commit": "0123456789abcdef", "modified": ["ortfuse/x.py"]}
    doc["protocol"]["configs"] = ["ort_disable_all", "ort_enable_all", "ortfuse_auto", "ortfuse_numba",
                                  "ort_enable_all_b", "openvino_f32"]
    doc["skipped"] = [{"model": "net_c", "reason": "net_c: pip could not download pkg==1.0 (no network): check..."}]
    for res, member in zip(doc["results"], ("a.onnx", "b.onnx")):
        res["zoo"] = None
        res["inputs"] = {"x": {"shape": [1, 3, 48, 320], "dtype": "float32"}}
        res["public"] = {"package": "pkg", "version": "1.0", "member": f"pkg/models/{member}",
                         "sha256": member[0] * 64, "inputs": {"x": [1, 3, 48, 320]}}
        base = res["configs"]["ort_enable_all"]["p50_ms"]
        res["configs"]["openvino_f32"] = _config("OpenVINO CPU plugin, f32 forced, same threads", base * 0.7,
                                                 [0.69, 0.7, 0.72], "faster")
        res["configs"]["ortfuse_numba"]["max_rel_diff"] = 2e-6
        res["configs"]["ort_enable_all"]["max_rel_diff"] = 1e-6
    return doc


def test_files_naming_the_former_fusion_true_configuration_render_as_files_naming_the_current_one(tmp_path):
    """``ortfuse_numba`` was the name of ``ortfuse_fused`` (fusion=True): result files written before the
    rename still render, the same tables (only a --configs list names the configuration as the file does)."""
    tables = _tables()
    for kind, doc in (("public", _synthetic_public()), ("bench", _synthetic())):
        text = json.dumps(doc)
        assert "ortfuse_numba" in text
        (tmp_path / f"{kind}-old.json").write_text(text)
        (tmp_path / f"{kind}-new.json").write_text(text.replace("ortfuse_numba", "ortfuse_fused"))
        old = tables.render_section(kind, f" files={kind}-old.json ", tmp_path)
        new = tables.render_section(kind, f" files={kind}-new.json ", tmp_path)
        assert old.replace("-old.json", "-new.json").replace("ortfuse_numba", "ortfuse_fused") == new
        assert "`fusion=True`" in new and "0.950 [0.900-0.970]" in new


def test_public_section_has_one_row_per_model_a_column_per_config_and_the_packages(tmp_path):
    tables = _tables()
    (tmp_path / "bench-public-x.json").write_text(json.dumps(_synthetic_public()))
    text = tables.render_section("public", " files=bench-public-x.json ", tmp_path)
    assert text.startswith("- Command: `ortfuse bench --suite public --batch 1 --runs 20 --repeats 3 --peer openvino "
                           "--memory off --json benchmarks/results/` ([bench-public-x.json]")
    for part in ("\n- Machine: Test CPU (avx2, fma), 4 logical cores",
                 "\n- Versions: onnxruntime 1.32.0, openvino 2026.4.1",
                 "ortfuse 0.1.0 (git 0123456789 with 1 modified file(s)), Python 3.11.7",
                 "Models: pkg 1.0: `a.onnx` (sha256 aaaaaaaaaaaa...), `b.onnx` (sha256 bbbbbbbbbbbb...)",
                 "| model (package) | input | stock ORT p50 ms | `fusion=True` / stock [repeats] | "
                 "`fusion=\"auto\"` / stock [repeats] | OpenVINO f32 / stock [repeats] | A/A control [repeats] |",
                 "| `net_a` (pkg 1.0) | x 1x3x48x320 | 12.0 | 0.950 [0.900-0.970] faster | 0.750 [0.700-0.800] faster "
                 "| 0.700 [0.690-0.720] faster | 1.000 [0.990-1.020] | 2.0e-06 / 1.0e-06 | hardswish:3 |",
                 "Not measured in this run:\n\n- net_c: pip could not download pkg==1.0"):
        assert part in text, part
    assert text.count("\n| `net_") == 2


def test_a_run_in_blocks_says_so_in_its_command_and_protocol_line(tmp_path):
    tables = _tables()
    doc = _synthetic_public()
    doc["protocol"].update(block=20, settle_ms=120.0, spinning=True)
    (tmp_path / "bench-public-x.json").write_text(json.dumps(doc))
    text = tables.render_section("public", " files=bench-public-x.json ", tmp_path)
    assert "--peer openvino --spinning on --block 20 --settle-ms 120 --memory off" in text
    assert ("blocks of 20 back-to-back runs (each block after 120 ms idle and one untimed run) of every "
            "configuration interleaved") in text and "ORT spinning on" in text


def test_print_renders_one_file_without_touching_the_readme(tmp_path, capsys):
    tables = _tables()
    path = tmp_path / "bench-public-x.json"
    path.write_text(json.dumps(_synthetic_public()))
    assert tables.main(["--readme", str(tmp_path / "absent.md"), "--print", "public", str(path)]) == 0
    assert capsys.readouterr().out == tables.render_section("public", " files=bench-public-x.json ", tmp_path)
    assert not (tmp_path / "absent.md").exists()


def test_readme_sections_equal_their_rendering_from_benchmarks_results():
    tables = _tables()
    readme = (ROOT / "README.md").read_text()
    sections = list(tables.SECTION.finditer(readme))
    # the public-model suite's tables first (ORT's default spinning in blocks, then single runs with
    # spinning off), on the Intel machine and then on the AMD one, the real MiniLM exports the same
    # two ways on each, then the generated zoo's
    assert [m.group("kind") for m in sections] == ["public"] * 4 + ["bench"] * 5
    for pair in (sections[0:2], sections[2:4], sections[4:6], sections[6:8]):
        protocols = [json.loads((tables.RESULTS / tables._files(m.group("args"))[0]).read_text())["protocol"]
                     for m in pair]
        assert [(p.get("block", 1) > 1, p["spinning"]) for p in protocols] == [(True, True), (False, False)]
    for m in sections:
        for name in tables._files(m.group("args")):
            assert (tables.RESULTS / name).is_file(), name
        rendered = tables.render_section(m.group("kind"), m.group("args"), tables.RESULTS)
        assert m.group("body") == "\n" + rendered + "\n", (
            "README.md's generated section is stale or hand-edited: run python tools/readme_tables.py"
        )


def test_an_input_shape_reads_as_its_dims_and_a_scalar_as_scalar():
    tool = _tables()
    assert tool._shape([1, 3, 48, 192]) == "1x3x48x192"
    assert tool._shape([]) == "scalar"  # silero_vad's sample rate
