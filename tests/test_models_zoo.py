"""The deterministic model zoo (``ortfuse.models``): validity, numerics, determinism, structure, cache, CLI."""

from __future__ import annotations

import argparse
import collections
import functools
import hashlib
import importlib
import json
import math
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

from ortfuse import models
from ortfuse.models import cache, cli, registry

BIG = {"resnet50", "resnet50_const", "bert_encoder", "minilm_encoder", "minilm_encoder_dynamo"}  # ~50-100 MB each
SLOW_RUN = {"picodet_layout"}  # a few MB of weights, but slow to build twice or to run on 2 cores
SMALL = [n for n in models.NAMES if n not in BIG]
CONST_PAIRS = [("resnet50", "resnet50_const"), ("mobilenetv3_block", "mobilenetv3_block_const")]
CONST_PARAMS = [pytest.param(*p, marks=pytest.mark.slow) if p[0] in BIG else p for p in CONST_PAIRS]


def _param(name: str, slow: set[str] = BIG):
    return pytest.param(name, marks=pytest.mark.slow) if name in slow else name


ALL = [_param(n) for n in models.NAMES]
ALL_RUN = [_param(n, BIG | SLOW_RUN) for n in models.NAMES]  # for tests that build twice or run the model


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo_cache")


@pytest.fixture(autouse=True)
def zoo_cache(monkeypatch, session_cache):
    """Every test builds into a per-session temporary cache, never ~/.cache."""
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(session_cache))
    return session_cache


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    """An empty cache of this test's own."""
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))
    return tmp_path


@functools.cache
def _model(name: str) -> onnx.ModelProto:
    return models.make(name)


def _session(name: str) -> ort.InferenceSession:
    return ort.InferenceSession(str(models.build(name)), providers=["CPUExecutionProvider"])


# -- graph helpers -------------------------------------------------------------------------------
def _ops(model):
    return collections.Counter(n.op_type for n in model.graph.node)


def _producers(model):
    return {out: n for n in model.graph.node for out in n.output}


def _consumers(model):
    uses = collections.defaultdict(list)
    for n in model.graph.node:
        for name in n.input:
            uses[name].append(n)
    return uses


def _constants(model) -> dict[str, np.ndarray]:
    """Initializers and Constant-node outputs by name."""
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            values[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return values


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _dims(value_info):
    return tuple(d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim)


# -- API -----------------------------------------------------------------------------------------
def test_names_default_and_descriptions():
    assert set(models.NAMES) == {
        "resnet50",
        "resnet50_const",
        "bert_encoder",
        "mlp_gemm_relu_gelu",
        "mobilenetv3_block",
        "mobilenetv3_block_const",
        "pplcnet_classifier",
        "crnn_recognizer",
        "minilm_encoder",
        "minilm_encoder_dynamo",
        "db_text_detector",
        "picodet_layout",
        "yolov8n",
    }
    assert models.DEFAULT == "db_text_detector" and models.DEFAULT in models.NAMES
    for name in models.NAMES:
        text = models.describe(name)
        assert text and "\n" not in text


def test_unknown_name_lists_known_ones():
    with pytest.raises(KeyError, match="mlp_gemm_relu_gelu"):
        models.describe("resnet51")
    with pytest.raises(KeyError, match="resnet50"):
        models.build("resnet51")


def test_cache_dir_from_env_else_home(monkeypatch, tmp_path):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "c"))
    assert cache.model_path("x") == tmp_path / "c" / "models" / "x.onnx"
    monkeypatch.delenv("ORTFUSE_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.model_path("x") == tmp_path / "home" / ".cache" / "ortfuse" / "models" / "x.onnx"


@pytest.mark.parametrize("name", models.NAMES)
def test_sample_inputs_shapes_and_determinism(name):
    spec = registry.get(name)
    feeds = models.sample_inputs(name, batch=3, seed=7)
    assert list(feeds) == list(spec.inputs)
    for key, array in feeds.items():
        assert array.dtype == np.dtype(onnx.helper.tensor_dtype_to_np_dtype(spec.dtypes.get(key, TensorProto.FLOAT)))
        assert array.shape == registry.concrete(spec.inputs[key], 3)
        assert array.shape[0] == 3
        np.testing.assert_array_equal(array, models.sample_inputs(name, batch=3, seed=7)[key])
        assert not np.array_equal(array, models.sample_inputs(name, batch=3, seed=8)[key])
    if name == "bert_encoder":
        assert feeds["hidden_states"].shape == (3, 128, 768)


# -- validity and numerics -----------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_checker_and_strict_shape_inference(name):
    model = _model(name)
    spec = registry.get(name)
    opset = getattr(importlib.import_module(f"ortfuse.models.{spec.module}"), "OPSET", 17)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", opset)]
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    assert {i.name: _dims(i) for i in model.graph.input} == spec.inputs
    assert {o.name: _dims(o) for o in inferred.graph.output} == spec.outputs
    for vi in model.graph.input:
        assert vi.type.tensor_type.elem_type == spec.dtypes.get(vi.name, TensorProto.FLOAT), vi.name
    for vi in model.graph.output:
        assert vi.type.tensor_type.elem_type == TensorProto.FLOAT, vi.name


@pytest.mark.parametrize("name", ALL_RUN)
def test_runs_on_stock_ort_with_dynamic_batch(name):
    sess = _session(name)
    spec = registry.get(name)
    assert [i.name for i in sess.get_inputs()] == list(spec.inputs)
    out1 = sess.run(None, models.sample_inputs(name, batch=1))
    feeds2 = models.sample_inputs(name, batch=2, seed=1)
    out2 = sess.run(None, feeds2)
    for (key, shape), y1, y2 in zip(spec.outputs.items(), out1, out2):
        assert y1.shape == registry.concrete(shape, 1), key
        assert y2.shape == registry.concrete(shape, 2), key
        assert np.isfinite(y1).all() and np.isfinite(y2).all()
        assert y1.std() > 1e-2, "outputs collapsed towards a constant"
    # Batch rows are independent: row 0 of a batch-2 run equals a batch-1 run of that row.
    row0 = sess.run(None, {k: v[:1] for k, v in feeds2.items()})
    np.testing.assert_allclose(row0[0], out2[0][:1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("plain,const", CONST_PARAMS)
def test_const_variant_computes_the_same_function(plain, const):
    feeds = models.sample_inputs(plain, batch=1, seed=3)
    y_plain = _session(plain).run(None, feeds)[0]
    y_const = _session(const).run(None, feeds)[0]
    np.testing.assert_allclose(y_const, y_plain, rtol=1e-3, atol=1e-4)


# -- determinism ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL_RUN)
def test_build_is_byte_identical(name, fresh_cache):
    first = models.make(name).SerializeToString()
    assert models.make(name).SerializeToString() == first
    path = models.build(name)
    assert path == fresh_cache / "models" / f"{name}.onnx"
    assert path.read_bytes() == first


def test_fresh_process_gives_the_same_bytes():
    code = textwrap.dedent(
        f"""
        import hashlib
        from ortfuse import models
        for name in {SMALL!r}:
            print(name, hashlib.sha256(models.make(name).SerializeToString()).hexdigest())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    theirs = dict(line.split() for line in out.splitlines())
    ours = {n: hashlib.sha256(_model(n).SerializeToString()).hexdigest() for n in SMALL}
    assert theirs == ours


# -- cache ---------------------------------------------------------------------------------------
NAME = "mobilenetv3_block"


def test_build_records_hash_and_reuses_the_file(fresh_cache, monkeypatch):
    path = models.build(NAME)
    record = json.loads(path.with_name(path.name + ".json").read_text())
    data = path.read_bytes()
    assert record["sha256"] == hashlib.sha256(data).hexdigest() and record["bytes"] == len(data)
    stamp = path.stat().st_mtime_ns

    def fail(name):
        raise AssertionError("cached model was regenerated")

    monkeypatch.setattr(registry, "make", fail)
    assert models.build(NAME) == path
    assert path.stat().st_mtime_ns == stamp
    with pytest.raises(AssertionError, match="regenerated"):
        models.build(NAME, force=True)
    assert sorted(p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")) == []


def test_build_replaces_a_corrupt_or_stale_file(fresh_cache, monkeypatch):
    path = models.build(NAME)
    good = path.read_bytes()
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # same size, different content
    assert not cache.is_cached(NAME, registry.recipe(NAME))
    assert models.build(NAME).read_bytes() == good

    stamp = path.stat().st_mtime_ns
    monkeypatch.setattr(registry, "recipe", lambda name: "generator changed")
    assert not cache.is_cached(NAME, "generator changed")
    models.build(NAME)
    assert path.stat().st_mtime_ns != stamp and cache.is_cached(NAME, "generator changed")


def test_recipe_covers_every_generator_module(monkeypatch, tmp_path):
    """A model's recipe changes with any module of the package, not only its own generator's: picodet
    imports layers and pplcnet."""
    for source in pathlib.Path(registry.__file__).parent.glob("*.py"):
        (tmp_path / source.name).write_bytes(source.read_bytes())
    monkeypatch.setattr(registry, "__file__", str(tmp_path / "registry.py"))
    before = registry.recipe("picodet_layout")
    assert before == registry.recipe("picodet_layout")
    for module in ("pplcnet.py", "layers.py"):
        (tmp_path / module).write_text((tmp_path / module).read_text() + "\n# edited\n")
        after = registry.recipe("picodet_layout")
        assert after != before, module
        before = after


def test_parallel_builds_agree(fresh_cache):
    code = "from ortfuse import models; print(models.build('mlp_gemm_relu_gelu'))"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    paths = {p.communicate()[0].strip() for p in procs}
    assert [p.returncode for p in procs] == [0, 0, 0]
    path = fresh_cache / "models" / "mlp_gemm_relu_gelu.onnx"
    assert paths == {str(path)}
    assert path.read_bytes() == _model("mlp_gemm_relu_gelu").SerializeToString()
    assert cache.is_cached("mlp_gemm_relu_gelu", registry.recipe("mlp_gemm_relu_gelu"))
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


# -- structure -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_resnet50_structure():
    model = _model("resnet50")
    ops, prod, uses = _ops(model), _producers(model), _consumers(model)
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert len(bns) == 53 and ops["Conv"] == 53
    assert all(prod[bn.input[0]].op_type == "Conv" for bn in bns)
    assert all(len(n.input) == 2 for n in model.graph.node if n.op_type == "Conv"), "Conv without bias"
    assert "Constant" not in ops and len(model.graph.initializer) > 0
    # 16 bottlenecks, each ending in a residual Add + Relu; 4 projection shortcuts.
    adds = [n for n in model.graph.node if n.op_type == "Add"]
    assert len(adds) == 16 and all([u.op_type for u in uses[a.output[0]]] == ["Relu"] for a in adds)
    assert ops["Relu"] == 1 + 16 * 3
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    strided = collections.Counter(tuple(_attr(c, "kernel_shape")) for c in convs if _attr(c, "strides") == [2, 2])
    assert strided == {(7, 7): 1, (3, 3): 3, (1, 1): 3}, "v1.5: stride on the 3x3 conv"
    for op in ("MaxPool", "GlobalAveragePool", "Flatten", "Gemm"):
        assert ops[op] == 1
    params = sum(math.prod(t.dims) for t in model.graph.initializer)
    assert 25.4e6 < params < 25.7e6  # ResNet-50 has 25.56M parameters plus BN running stats


@pytest.mark.parametrize("plain,const", CONST_PARAMS)
def test_const_variant_structure(plain, const):
    pm, cm = _model(plain), _model(const)
    assert len(cm.graph.initializer) == 0
    prod, uses, values = _producers(cm), _consumers(cm), _constants(cm)
    convs = [n for n in cm.graph.node if n.op_type == "Conv"]
    bias_adds = set()
    for conv in convs:
        assert len(conv.input) == 2 and prod[conv.input[1]].op_type == "Constant"
        (add,) = uses[conv.output[0]]
        assert add.op_type == "Add" and add.input[0] == conv.output[0]
        reshape = prod[add.input[1]]
        assert reshape.op_type == "Reshape"
        assert [prod[i].op_type for i in reshape.input] == ["Constant", "Constant"]
        channels = values[conv.input[1]].shape[0]
        assert values[reshape.input[0]].shape == (channels,)
        assert values[reshape.input[1]].tolist() == [1, channels, 1, 1]
        bias_adds.add(add.name)
    bns = [n for n in cm.graph.node if n.op_type == "BatchNormalization"]
    assert bns and all(prod[bn.input[0]].name in bias_adds for bn in bns)
    # Same network: removing Constants and the bias Reshape->Add gives the plain op counts.
    extra = collections.Counter({"Constant": _ops(cm)["Constant"], "Reshape": len(convs), "Add": len(convs)})
    assert _ops(cm) - extra == _ops(pm)
    # Same weights, except BN running means, which absorb the new conv bias.
    plain_values = _constants(pm)
    assert set(plain_values) <= set(values)
    for key, value in plain_values.items():
        if not key.endswith("running_mean"):
            np.testing.assert_array_equal(values[key], value, err_msg=key)
    shifted = [k for k in plain_values if k.endswith("running_mean") and not np.array_equal(values[k], plain_values[k])]
    assert len(shifted) == len(bns)


@pytest.mark.slow
def test_bert_encoder_structure():
    model = _model("bert_encoder")
    ops, prod, uses, values = _ops(model), _producers(model), _consumers(model), _constants(model)
    assert "LayerNormalization" not in ops and "Gelu" not in ops
    assert ops["Erf"] == 4 and ops["Softmax"] == 4
    assert ops["ReduceMean"] == 16 and ops["Sqrt"] == 8 and ops["MatMul"] == 4 * 8
    # erf-Gelu in exporter order: Div(sqrt 2) -> Erf -> Add(1) -> Mul(x) -> Mul(0.5).
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    rank = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in inferred.graph.value_info}
    for erf in (n for n in model.graph.node if n.op_type == "Erf"):
        div = prod[erf.input[0]]
        x = div.input[0]
        assert div.op_type == "Div" and values[div.input[1]] == pytest.approx(math.sqrt(2))
        (add,) = uses[erf.output[0]]
        assert add.op_type == "Add" and values[add.input[1]] == 1.0
        (mul_x,) = uses[add.output[0]]
        assert mul_x.op_type == "Mul" and x in mul_x.input
        (mul_half,) = uses[mul_x.output[0]]
        assert mul_half.op_type == "Mul" and values[mul_half.input[1]] == 0.5
        # x is the 3-D FFN MatMul + Add(bias).
        bias_add = prod[x]
        matmul = prod[bias_add.input[0]]
        assert (bias_add.op_type, matmul.op_type) == ("Add", "MatMul") and bias_add.input[1] in values
        assert rank[matmul.input[0]] == 3 and values[matmul.input[1]].shape == (768, 3072)
    pows = [n for n in model.graph.node if n.op_type == "Pow"]
    assert len(pows) == 8 and all(values[p.input[1]] == 2.0 for p in pows)
    for sqrt in (n for n in model.graph.node if n.op_type == "Sqrt"):
        eps_add = prod[sqrt.input[0]]
        assert eps_add.op_type == "Add" and prod[eps_add.input[0]].op_type == "ReduceMean"
        (div,) = uses[sqrt.output[0]]
        assert div.op_type == "Div" and prod[div.input[0]].op_type == "Sub"


def test_mlp_epilogues():
    model = _model("mlp_gemm_relu_gelu")
    ops, uses, values = _ops(model), _consumers(model), _constants(model)
    gemms = [n for n in model.graph.node if n.op_type == "Gemm"]
    assert [_attr(g, "transB", 0) for g in gemms] == [1, 1, 1, 1, 0, 0, 0, 0]
    assert all(len(g.input) == 3 and g.input[2] in values for g in gemms)
    epilogue = [sorted(u.op_type for u in uses[g.output[0]]) for g in gemms]
    assert epilogue == [
        ["Relu"], ["Div", "Mul"],  # block 0: Relu | erf-Gelu (x feeds Div and Mul(x))
        ["Div", "Mul"], ["Relu"],  # block 1: erf-Gelu | Relu
        ["Add", "Mul", "Pow"], ["Relu"],  # block 2: tanh-Gelu | Relu
        ["Relu"], [],  # block 3: Relu -> erf-Gelu | none
    ]
    assert gemms[-1].output[0] == "output"
    (relu_then,) = uses[gemms[6].output[0]]
    assert sorted(u.op_type for u in uses[relu_then.output[0]]) == ["Div", "Mul"]
    assert ops["Erf"] == 3 and ops["Tanh"] == 1 and ops["Relu"] == 4
    (pow_,) = [n for n in model.graph.node if n.op_type == "Pow"]
    assert values[pow_.input[1]] == 3.0
    scalars = {float(v) for v in values.values() if v.ndim == 0}
    assert {0.5, 1.0}.issubset(scalars)
    assert any(math.isclose(s, 0.044715, rel_tol=1e-6) for s in scalars)
    assert any(math.isclose(s, math.sqrt(2 / math.pi), rel_tol=1e-6) for s in scalars)


def test_mobilenet_structure():
    model = _model("mobilenetv3_block")
    ops, prod, uses, values = _ops(model), _producers(model), _consumers(model), _constants(model)
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert len(bns) == 18 and all(prod[bn.input[0]].op_type == "Conv" for bn in bns)
    # HardSwish: Add(x, 3) -> Clip(0, 6) -> Div(6) -> Mul(x, .)
    hardswish = 0
    for clip in (n for n in model.graph.node if n.op_type == "Clip"):
        add = prod[clip.input[0]]
        assert add.op_type == "Add" and values[add.input[1]] == 3.0
        assert values[clip.input[1]] == 0.0 and values[clip.input[2]] == 6.0
        (div,) = uses[clip.output[0]]
        assert div.op_type == "Div" and values[div.input[1]] == 6.0
        (mul,) = uses[div.output[0]]
        assert mul.op_type == "Mul" and list(mul.input) == [add.input[0], div.output[0]]
        hardswish += 1
    assert hardswish == 8
    # SiLU: Sigmoid -> Mul(x, sigmoid(x))
    sigmoids = [n for n in model.graph.node if n.op_type == "Sigmoid"]
    assert len(sigmoids) == 4
    for sig in sigmoids:
        (mul,) = uses[sig.output[0]]
        assert mul.op_type == "Mul" and list(mul.input) == [sig.input[0], sig.output[0]]
    # Depthwise 3x3 convs: group == channels.
    depthwise = [n for n in model.graph.node if n.op_type == "Conv" and _attr(n, "group", 1) > 1]
    assert len(depthwise) == 6
    for conv in depthwise:
        assert _attr(conv, "kernel_shape") == [3, 3] and values[conv.input[1]].shape[:2] == (_attr(conv, "group"), 1)
    # Squeeze-excite: GlobalAveragePool -> Conv -> Relu -> Conv -> HardSigmoid -> Mul.
    assert ops["GlobalAveragePool"] == 4
    for gap in (n for n in model.graph.node if n.op_type == "GlobalAveragePool"):
        chain, t = [], gap.output[0]
        for _ in range(5):
            (node,) = uses[t]
            chain.append(node.op_type)
            t = node.output[0]
        assert chain == ["Conv", "Relu", "Conv", "HardSigmoid", "Mul"]
        assert gap.input[0] in node.input
    residual = [n for n in model.graph.node if n.op_type == "Add" and not set(n.input) & set(values)]
    assert len(residual) == 3


# -- CLI -----------------------------------------------------------------------------------------
def _cli(*argv):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(list(argv)))


def test_cli_build_and_list(fresh_cache, capsys):
    assert _cli("build", NAME) == 0
    out = capsys.readouterr().out
    path = fresh_cache / "models" / f"{NAME}.onnx"
    assert str(path) in out and "MB" in out and path.is_file()
    assert _cli("list") == 0
    rows = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows == {n: "cached" if n == NAME else "-" for n in models.NAMES}


def test_cli_rejects_unknown_names_and_missing_action(fresh_cache, capsys):
    with pytest.raises(SystemExit) as exc:
        _cli("build", "resnet51")
    assert exc.value.code == 2 and "resnet51" in capsys.readouterr().err
    assert not (fresh_cache / "models" / "resnet51.onnx").exists()
    assert _cli() == 2


def test_python_dash_m_lists_the_zoo(fresh_cache):
    env = dict(os.environ, ORTFUSE_CACHE_DIR=str(fresh_cache))
    result = subprocess.run([sys.executable, "-m", "ortfuse.models", "list"], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    for name in models.NAMES:
        assert name in result.stdout
