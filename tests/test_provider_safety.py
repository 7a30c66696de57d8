"""Provider safety: fused ops are CPU custom ops, so fusion steps aside when an accelerator would
run the model, and applies when ORT falls back to the CPU (the accelerator is not available)."""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime
import pytest

import ortfuse
from ortfuse import session

from model_fixtures import ffn_inputs, ffn_matmul_add_relu


def test_unavailable_accelerator_falls_back_to_cpu_and_fuses():
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ORT warns that CUDA is not available
        stock = onnxruntime.InferenceSession(ffn_matmul_add_relu().SerializeToString(), providers=providers)
        ours = ortfuse.InferenceSession(ffn_matmul_add_relu(), providers=providers, fusion=True)
    assert ours.get_providers() == stock.get_providers() == ["CPUExecutionProvider"]
    assert ours.fusion_report.counts() == {"gemm_act": 1, "add_relu": 1}
    feeds = ffn_inputs()
    np.testing.assert_allclose(ours.run(None, feeds)[0], stock.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("providers, steps_aside", [
    (["CUDAExecutionProvider", "CPUExecutionProvider"], True),
    ([("TensorrtExecutionProvider", {}), "CUDAExecutionProvider"], True),
    (["CPUExecutionProvider"], False),
    (None, False),
    (["NoSuchExecutionProvider", "CPUExecutionProvider"], False),
])
def test_available_accelerator_first_makes_fusion_step_aside(monkeypatch, providers, steps_aside):
    """The rule itself, with the available-provider list of a machine that has CUDA and TensorRT."""
    monkeypatch.setattr(session._ort, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    reason = session._provider_problem(providers, None)
    assert bool(reason) is steps_aside
    if steps_aside:
        assert "fused CPU ops would pull its nodes onto the CPU" in reason


def test_session_with_an_accelerator_first_runs_the_original_model(monkeypatch):
    monkeypatch.setattr(session._ort, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    model = ffn_matmul_add_relu()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ours: fusion requested but not applied; ORT's: CUDA missing here
        ours = ortfuse.InferenceSession(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"], fusion=True)
    assert not ours.fusion_report.applied and "CUDAExecutionProvider" in ours.fusion_report.reason
    assert ours._model_bytes == model.SerializeToString()
