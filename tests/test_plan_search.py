"""tools/plan_search.py: every match fused against the same plan with each kind of match left to ORT,
timed by auto's own comparison (no timing asserted: which plan wins is the machine's)."""

from __future__ import annotations

import json

import tool_modules


def _tool():
    return tool_modules.load("plan_search")


def test_kinds_partition_the_legal_matches():
    """Every match fuse makes lands in exactly one kind, named by pattern and kernel path."""
    import onnx

    import ortfuse
    import ortfuse.models as zoo
    from ortfuse.fusion.catalogue import validate_patterns

    model = onnx.load(zoo.resolve("mobilenetv3_block"))
    kinds = _tool().match_kinds(model, validate_patterns(None))
    _, report = ortfuse.fuse(model, validate_patterns(None))
    assert sorted(k.split(" ")[0] for k in kinds) == ["conv_act", "conv_add"]
    assert sorted(tuple(r.nodes) for rs in kinds.values() for r in rs) == sorted(tuple(r.nodes) for r in report.fused)


def test_each_kind_left_out_is_a_candidate_beside_the_fused_aa(tmp_path, monkeypatch):
    """The zoo's MobileNetV3 block: one candidate per kind plus the whole plan twice, each checked
    and judged against stock ORT; ratios to the whole plan are per pass (the whole plan's own is 1)."""
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    tool = _tool()
    out = tmp_path / "search.json"
    assert tool.main(["mobilenetv3_block", "--threads", "1", "--budget", "0.5", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    expected = {tool.WHOLE, tool.WHOLE_AA} | {tool.WITHOUT + k for k in doc["kinds"]}
    assert len(doc["kinds"]) >= 2 and set(doc["candidates"]) | set(doc["left_out"]) == expected
    assert doc["candidates"][tool.WHOLE]["over_whole"] == 1.0
    assert all(r["over_stock"] > 0 and r["over_whole"] > 0 for r in doc["candidates"].values())
    assert doc["helps"] in ([], [doc["chosen"]]) and all(h.startswith(tool.WITHOUT) for h in doc["helps"])
