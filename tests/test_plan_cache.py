"""The fusion plan cache: a second session on the same model and request does no planning work (the
model is not even parsed), gets the same report and outputs, and any change to the model, the
request, the environment, ortfuse's code or the auto decisions plans again."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest

import ortfuse
from ortfuse.foundation import source_digest
from ortfuse.runtime import plan_cache

from model_fixtures import annotated, ffn_inputs, ffn_matmul_add_relu


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "ffn.onnx"
    onnx.save(ffn_matmul_add_relu(), str(path))
    return str(path)


def _forbid_parsing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was parsed despite a cached plan")

    monkeypatch.setattr(onnx, "load", refuse)
    monkeypatch.setattr(onnx, "load_from_string", refuse)
    monkeypatch.setattr(onnx, "load_model", refuse)


def _cached(report) -> bool:
    return any(n.startswith("plan read from ortfuse's cache") for n in report.notes)


def test_second_session_uses_the_cached_plan_without_parsing(model_path, monkeypatch):
    first = ortfuse.InferenceSession(model_path, fusion=True)
    assert first.fusion_report.applied and not _cached(first.fusion_report)
    expected = first.run(None, ffn_inputs())
    _forbid_parsing(monkeypatch)
    second = ortfuse.InferenceSession(model_path, fusion=True)
    assert _cached(second.fusion_report)
    assert [(m.pattern_id, m.nodes, m.decision) for m in second.fusion_report.matches] == \
        [(m.pattern_id, m.nodes, m.decision) for m in first.fusion_report.matches]
    for a, b in zip(second.run(None, ffn_inputs()), expected):
        np.testing.assert_array_equal(a, b)
    # ORT loaded the fused model from the cache file: no copy of it is kept in Python
    assert second._model_bytes is None and second._model_path.startswith(str(plan_cache.root()))
    assert first._model_path == second._model_path


@pytest.mark.parametrize("patterns", [None, ["gemm_act", "add_relu"]], ids=["all", "explicit"])
def test_a_cache_hit_in_a_new_process_imports_neither_onnx_nor_the_rewriter(model_path, patterns):
    """The plan cache's point: a session whose plan is cached costs what a stock session costs, also
    with explicit ``fusion_patterns`` (checked against the rule modules' names, not their code)."""
    import subprocess
    import sys

    code = ("import sys, ortfuse\n"
            f"s = ortfuse.InferenceSession({model_path!r}, fusion=True, fusion_patterns={patterns!r})\n"
            "assert any(n.startswith(\"plan read from ortfuse's cache\") for n in s.fusion_report.notes)\n"
            "loaded = [m for m in ('onnx', 'ortfuse.fusion.rewrite', 'ortfuse.tune.tuner') if m in sys.modules]\n"
            "assert not loaded, loaded\n")
    ortfuse.InferenceSession(model_path, fusion=True, fusion_patterns=patterns)  # fills the cache
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))


def test_bytes_input_is_keyed_by_content(model_path):
    data = pathlib.Path(model_path).read_bytes()
    ortfuse.InferenceSession(data, fusion=True)
    assert _cached(ortfuse.InferenceSession(data, fusion=True).fusion_report)
    other = ffn_matmul_add_relu(seed=5).SerializeToString()
    assert not _cached(ortfuse.InferenceSession(other, fusion=True).fusion_report)


def test_request_options_and_environment_are_part_of_the_key(model_path, monkeypatch):
    ortfuse.InferenceSession(model_path, fusion=True)
    assert not _cached(ortfuse.InferenceSession(model_path, fusion=True, fusion_patterns=["add_relu"]).fusion_report)
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = 1
    assert not _cached(ortfuse.InferenceSession(model_path, so, fusion=True).fusion_report)
    monkeypatch.setenv("ORTFUSE_TUNE", "off")
    assert not _cached(ortfuse.InferenceSession(model_path, fusion=True).fusion_report)
    monkeypatch.setattr(source_digest, "code_digest", lambda: "another ortfuse")
    monkeypatch.delenv("ORTFUSE_TUNE")
    assert not _cached(ortfuse.InferenceSession(model_path, fusion=True).fusion_report)


def test_every_layout_switch_is_part_of_the_key():
    """Each environment switch a layout rewrite reads changes the plan, so it keys the plan."""
    from ortfuse.layout import depthwise, planner, pointwise, se_block, winograd

    switches = {planner.ENV, planner.PADDING_ENV, winograd.ENV, pointwise.ENV, se_block.ENV, depthwise.ENV}
    assert switches <= set(plan_cache._ENV_KEYS), switches - set(plan_cache._ENV_KEYS)


def test_a_changed_model_file_is_planned_again(model_path):
    ortfuse.InferenceSession(model_path, fusion=True)
    model = ffn_matmul_add_relu()
    model.doc_string = "edited"
    onnx.save(model, model_path)
    assert not _cached(ortfuse.InferenceSession(model_path, fusion=True).fusion_report)


def test_a_touched_file_with_the_same_bytes_reads_its_plan_by_content(model_path):
    ortfuse.InferenceSession(model_path, fusion=True)
    st = os.stat(model_path)
    os.utime(model_path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert _cached(ortfuse.InferenceSession(model_path, fusion=True).fusion_report)


def test_changed_auto_decisions_make_the_plan_stale(model_path, monkeypatch):
    from ortfuse.tune import tuner as tune

    monkeypatch.setenv("ORTFUSE_TUNE", "sync")  # measured at creation, not in the background

    first = ortfuse.InferenceSession(model_path, fusion="auto")
    assert not _cached(first.fusion_report)
    assert _cached(ortfuse.InferenceSession(model_path, fusion="auto").fusion_report)
    decisions = tune.tune(onnx.load(model_path), measure=False)
    assert decisions.from_cache
    st = os.stat(decisions.path)
    os.utime(decisions.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched, same decisions
    assert _cached(ortfuse.InferenceSession(model_path, fusion="auto").fusion_report)
    text = pathlib.Path(decisions.path).read_text()
    pathlib.Path(decisions.path).write_text(text.replace('"seconds": ', '"seconds": 1')) # as `ortfuse tune --force`
    os.utime(decisions.path, ns=(st.st_atime_ns, st.st_mtime_ns))  # its mtime restored: the content counts
    assert not _cached(ortfuse.InferenceSession(model_path, fusion="auto").fusion_report)


def test_unmeasured_auto_is_not_cached(model_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_TUNE", "off")
    for _ in range(2):
        report = ortfuse.InferenceSession(model_path, fusion="auto").fusion_report
        assert not report.applied and not _cached(report)


def test_stale_annotation_warns_on_every_session(tmp_path):
    model = annotated(ffn_matmul_add_relu(), patterns="add_relu")
    entry = model.metadata_props.add()
    entry.key, entry.value = "ortfuse_graph_digest", "0123456789abcdef"
    path = str(tmp_path / "stale.onnx")
    onnx.save(model, path)
    for expect_cached in (False, True):
        with pytest.warns(UserWarning, match="annotation was written for another graph"):
            session = ortfuse.InferenceSession(path)
        assert _cached(session.fusion_report) == expect_cached


def test_step_aside_is_never_cached(model_path):
    so = onnxruntime.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ortfuse.InferenceSession(model_path, so, fusion=True)
    assert not plan_cache.root().exists() or not list(plan_cache.root().glob("*.json"))


def test_unwritable_cache_folder_still_fuses(model_path, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(blocker / "cache"))  # cannot be created, even by root
    for _ in range(2):
        session = ortfuse.InferenceSession(model_path, fusion=True)
        assert session.fusion_report.applied and not _cached(session.fusion_report)
        assert session._model_bytes is not None  # ORT got the fused bytes directly
        np.testing.assert_allclose(session.run(None, ffn_inputs())[0],
                                   onnxruntime.InferenceSession(model_path).run(None, ffn_inputs())[0],
                                   rtol=1e-5, atol=1e-5)


def test_folder_is_trimmed_oldest_first(model_path, monkeypatch):
    # made by a process that has ended: a live process's plans are never trimmed (tests/test_cache_safety.py)
    code = ("import json, sys, ortfuse\nfor p in json.loads(sys.argv[2]):\n"
            "    ortfuse.InferenceSession(sys.argv[1], fusion=True, fusion_patterns=p)")
    subprocess.run([sys.executable, "-c", code, model_path, '[["add_relu"], ["gemm_act"]]'], check=True)
    entries = sorted(plan_cache.root().glob("*.json"))
    assert len(entries) == 2
    for age, p in enumerate(entries):  # entries[0] is the older one, whatever the clock's resolution
        os.utime(p, ns=(10**18 + age * 10**9, 10**18 + age * 10**9))
    one_entry = entries[-1].stat().st_size + entries[-1].with_suffix(".onnx").stat().st_size
    monkeypatch.setattr(plan_cache, "MAX_BYTES", one_entry * 2 - 1)
    ortfuse.InferenceSession(model_path, fusion=True)  # a third entry: the oldest two no longer fit
    left = list(plan_cache.root().glob("*.json"))
    assert entries[0] not in left and len(left) in (1, 2)  # the oldest went first
    newest = max(left, key=lambda p: p.stat().st_mtime_ns)
    assert newest not in entries  # the entry just written is never the one trimmed
    assert sum(p.stat().st_size + p.with_suffix(".onnx").stat().st_size for p in left) <= plan_cache.MAX_BYTES


def test_code_digest_is_the_same_in_every_process():
    """Regression: the digest iterated a set of folders, whose order follows the per-process string
    hash seed, so another process (the bench's memory child) missed the cache about half the time."""
    code = "from ortfuse.foundation import source_digest; print(source_digest.code_digest())"
    digests = {subprocess.run([sys.executable, "-c", code],
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}, capture_output=True, text=True,
                              check=True).stdout.strip() for seed in (0, 1, 2, 3)}
    assert digests == {source_digest.code_digest()}


def test_a_plan_is_read_under_the_key_the_tuning_process_stored_it_under(model_path, monkeypatch):
    """The serving process reads the plan its tuning process made under that process's key
    (``planning.prepare(plan_key=)``), not its own: each key holds a digest of ortfuse's sources as
    its process read them, and a plan missed here is made again in the serving process, parsing and
    fusing beside served runs."""
    from ortfuse.runtime import planning
    from ortfuse.tune.decisions import Decision, Tuning, constants_digester

    model = onnx.load(model_path)
    _, unconstrained = ortfuse.fuse(model)
    digest = constants_digester(model)
    tuning = Tuning({})
    tuning.decisions = [Decision(m.pattern_id, list(m.nodes), True, "stated", kernel=m.kernel,
                                 constants=digest(list(m.nodes))) for m in unconstrained.fused]
    made = planning.prepare(model_path, None, "auto", None, mode="off", tuning=tuning)
    key = planning.plan_key(model_path, None, "auto", None)
    assert made.plan is not None and plan_cache.load(key) is not None
    monkeypatch.setattr(source_digest, "code_digest", lambda: "the serving process read other sources")
    assert planning.plan_key(model_path, None, "auto", None) != key
    again = planning.prepare(model_path, None, "auto", None, mode="off", tuning=tuning)
    assert again.plan is not None and not _cached(again.report)  # under its own key: a miss, planned again
    _forbid_parsing(monkeypatch)
    read = planning.prepare(model_path, None, "auto", None, mode="off", tuning=tuning, plan_key=key)
    assert read.plan is not None and read.source == made.source and _cached(read.report)


def test_a_copy_at_another_path_reads_the_plan_of_its_bytes(model_path, tmp_path, monkeypatch):
    """The same bytes at a new path (a deployment folder): the plan stored for the original, found by
    content without parsing, then linked under the new path's own key; the outputs are the plan's."""
    first = ortfuse.InferenceSession(model_path, fusion=True)
    expected = first.run(None, ffn_inputs())
    copy = tmp_path / "deployed" / "ffn.onnx"
    copy.parent.mkdir()
    copy.write_bytes(pathlib.Path(model_path).read_bytes())
    _forbid_parsing(monkeypatch)
    second = ortfuse.InferenceSession(str(copy), fusion=True)
    assert _cached(second.fusion_report) and second.fusion_report.applied
    for a, b in zip(second.run(None, ffn_inputs()), expected):
        np.testing.assert_array_equal(a, b)
    by_path = plan_cache.key(str(copy), None, True, None, None)
    assert plan_cache.load(by_path) is not None  # the next session at this path hits by path


def test_a_changed_copy_is_planned_again(model_path, tmp_path):
    ortfuse.InferenceSession(model_path, fusion=True)
    model = ffn_matmul_add_relu()
    model.doc_string = "another model"
    copy = tmp_path / "other.onnx"
    onnx.save(model, str(copy))
    assert not _cached(ortfuse.InferenceSession(str(copy), fusion=True).fusion_report)


def test_a_model_with_external_data_is_keyed_by_its_data_too(tmp_path):
    """Its weights lie beside it: the key holds the location each external-data entry names and the
    sha256 of the file there, so the same model bytes beside other weights get another key."""
    path = tmp_path / "ext.onnx"
    onnx.save(ffn_matmul_add_relu(), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="w.bin", size_threshold=0)
    found = plan_cache.identity(str(path))
    assert found is not None and found[0].endswith(
        "|w.bin=" + plan_cache.content_digest(str(tmp_path / "w.bin")).sha256)
    plain = tmp_path / "plain.onnx"
    onnx.save(ffn_matmul_add_relu(), str(plain))
    assert plan_cache.key(str(plain), None, True, None, None) == plan_cache.key(plain.read_bytes(), None, True,
                                                                                None, None)
