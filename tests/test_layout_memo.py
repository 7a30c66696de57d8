"""``tune.layout_memo``: inside ``remembering()`` a fused model is laid out once (the tuning's timed
plan and the plan it then makes); outside, every call runs the layout step."""

from __future__ import annotations

import onnxruntime

import ortfuse
from ortfuse.foundation.session_options import measuring_options
from ortfuse.fusion.provenance import native_op_types
from ortfuse.layout import planner
from ortfuse.tune import layout_memo

from model_fixtures import ffn_matmul_add_relu


def test_a_fused_model_is_laid_out_once_while_remembering(monkeypatch):
    calls: list = []
    real = planner.plan_layout

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(planner, "plan_layout", spy)
    model = ffn_matmul_add_relu()
    fused, _ = ortfuse.fuse(model)
    native = frozenset(native_op_types(fused))
    so = measuring_options(onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL, threads=2)
    first = layout_memo.plan_layout(model, fused, so, native)
    layout_memo.plan_layout(model, fused, so, native)
    assert len(calls) == 2  # not remembering: the step runs each time
    with layout_memo.remembering():
        assert layout_memo.plan_layout(model, fused, so, native) == first
        assert layout_memo.plan_layout(model, fused, so, native) == first
        assert len(calls) == 3
        other = measuring_options(onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL, threads=1)
        layout_memo.plan_layout(model, fused, other, native)  # other options: laid out again
        assert len(calls) == 4
    layout_memo.plan_layout(model, fused, so, native)
    assert len(calls) == 5  # the block ended: nothing remembered
