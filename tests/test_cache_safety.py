"""The cache never serves a stale plan, never runs code it did not build, and keeps models private
(docs/ARCHITECTURE.md §7): every case with real files and, where it matters, real processes."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper, numpy_helper

import ortfuse
from ortfuse.foundation import files
from ortfuse.runtime import plan_cache

from model_fixtures import ffn_matmul_add_relu

TOL = dict(rtol=1e-4, atol=1e-4)  # fused vs stock ORT, float32


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    # digests remembered at once, as for files older than RACY_S
    monkeypatch.setattr(files, "RACY_S", 0.0, raising=False)


def tiny_cnn(seed: int) -> onnx.ModelProto:
    """Conv 3x3 + SiLU -> Conv 1x1: the weights from ``seed``, the same bytes size for every seed."""
    rng = np.random.default_rng(seed)

    def w(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 3, name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["s1"]), helper.make_node("Mul", ["c1", "s1"], ["m1"]),
             helper.make_node("Conv", ["m1", "w2"], ["y"])]
    x, y = (helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1, 8, 12, 12]) for n in "xy")
    graph = helper.make_graph(nodes, "cnn", [x], [y],
                              [w("w1", 16, 8, 3, 3), w("b1", 16), w("w2", 8, 16, 1, 1)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cnn_feed() -> dict:
    return {"x": np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)}


def stock(path: str) -> np.ndarray:
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, cnn_feed())[0]


def replace_keeping_stat(path: str, write) -> None:
    """Rewrite ``path`` with ``write(path)`` and set its mtime back, as ``cp -p``, ``rsync -t`` and
    reproducible images do: same size, same mtime, other bytes."""
    st = os.stat(path)
    write(path)
    assert os.stat(path).st_size == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300, check=False)


# ------------------------------------------------------------------ 1. plan identity by content

def test_a_replaced_model_of_the_same_size_and_mtime_is_planned_again(tmp_path):
    path = str(tmp_path / "cnn.onnx")
    onnx.save(tiny_cnn(1), path)
    first = ortfuse.InferenceSession(path, fusion=True)
    assert first.fusion_report.applied
    np.testing.assert_allclose(first.run(None, cnn_feed())[0], stock(path), **TOL)
    replace_keeping_stat(path, lambda p: onnx.save(tiny_cnn(2), p))
    second = ortfuse.InferenceSession(path, fusion=True)
    assert second.fusion_report.applied
    np.testing.assert_allclose(second.run(None, cnn_feed())[0], stock(path), **TOL)
    # a fresh process, which reads the digests remembered on disk, gets the new weights too
    proc = python(f"""
        import numpy as np, ortfuse
        x = np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32)
        np.save({str(tmp_path / 'out.npy')!r}, ortfuse.InferenceSession({path!r}, fusion=True).run(None, {{"x": x}})[0])
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), stock(path), **TOL)


def test_replaced_external_data_is_planned_again(tmp_path):
    path = str(tmp_path / "cnn.onnx")
    onnx.save(tiny_cnn(1), path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    first = ortfuse.InferenceSession(path, fusion=True)
    assert first.fusion_report.applied
    np.testing.assert_allclose(first.run(None, cnn_feed())[0], stock(path), **TOL)
    other = tmp_path / "other"
    other.mkdir()
    onnx.save(tiny_cnn(2), str(other / "cnn.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="w.bin", size_threshold=0)
    assert (other / "cnn.onnx").read_bytes() == pathlib.Path(path).read_bytes()  # only the weights file differs
    replace_keeping_stat(str(tmp_path / "w.bin"), lambda p: pathlib.Path(p).write_bytes((other / "w.bin").read_bytes()))
    second = ortfuse.InferenceSession(path, fusion=True)
    assert second.fusion_report.applied
    np.testing.assert_allclose(second.run(None, cnn_feed())[0], stock(path), **TOL)


def test_a_warm_creation_reads_no_model_bytes(tmp_path, monkeypatch):
    """The digest of a file state is computed once: a second session hashes nothing."""
    path = str(tmp_path / "cnn.onnx")
    onnx.save(tiny_cnn(1), path)
    ortfuse.InferenceSession(path, fusion=True)
    monkeypatch.setattr(files, "_digests", {})  # as in a fresh process: only the digests on disk
    hashed = []
    real = files.model_bytes
    monkeypatch.setattr(files, "model_bytes", lambda source: hashed.append(source) or real(source))
    session = ortfuse.InferenceSession(path, fusion=True)
    assert any(n.startswith("plan read from ortfuse's cache") for n in session.fusion_report.notes)
    assert hashed == []


def test_a_plan_made_while_its_model_changed_is_not_stored(tmp_path, monkeypatch):
    path = str(tmp_path / "cnn.onnx")
    onnx.save(tiny_cnn(1), path)
    cache_key = plan_cache.key(path, None, True, None, None)
    onnx.save(tiny_cnn(2), path)  # between the key and the store, as a deployment writing the file would
    assert plan_cache.store(cache_key, {"report": {}}, b"fused", []) is None
    assert plan_cache.load(cache_key) is None


# ------------------------------------------------------------------ 2. a private cache

def _modes(root: pathlib.Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mode & 0o777 for p in [root, *root.rglob("*")]}


def test_every_folder_is_0700_and_every_file_0600_under_umask_022(tmp_path):
    cache = tmp_path / "fresh" / "cache"
    path = str(tmp_path / "cnn.onnx")
    onnx.save(tiny_cnn(1), path)
    proc = python(f"""
        import os
        os.umask(0o022)
        import ortfuse
        from ortfuse.kernel_choice import ranking
        from ortfuse.layout import choice_cache
        from ortfuse.models import cache as model_cache
        assert ortfuse.InferenceSession({path!r}, fusion=True).fusion_report.applied
        ranking.record({{"Conv|silu|float32": {{"order": ["native", "ort"]}}}})
        choice_cache.remember("probe", True, [0.9])
        with model_cache.locked("tiny"):
            model_cache.store("tiny", b"model bytes", "recipe")
    """, ORTFUSE_CACHE_DIR=str(cache))
    assert proc.returncode == 0, proc.stderr[-2000:]
    modes = _modes(cache)
    folders = {name: mode for name, mode in modes.items() if (cache / name).is_dir()}
    assert set(folders.values()) == {0o700}, folders
    loose = {name: oct(mode) for name, mode in modes.items() if name not in folders and mode != 0o600}
    assert loose == {}
    for sub in ("plans", "tuning", "models", "sources", "digests"):
        assert sub in modes, sorted(modes)
    assert any(name.startswith("plans/") and name.endswith(".onnx") for name in modes)


def _library_name(tmp_path) -> str:
    """The file name this ortfuse looks for in ``<cache>/ops/`` (its key), asked of a fresh process."""
    proc = python("from ortfuse.custom_ops.aot.library import default_path; print(default_path().name)",
                  ORTFUSE_CACHE_DIR=str(tmp_path / "probe"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


def plant_library(path: pathlib.Path, marker: pathlib.Path) -> None:
    """A shared library whose constructor creates ``marker`` the moment it is loaded."""
    from ortfuse.custom_ops.aot.toolchain import compiler

    source = path.with_suffix(".c")
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void planted(void) '
                      f'{{ FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    subprocess.run([*compiler(), "-shared", "-fPIC", "-o", str(path), str(source)], check=True, timeout=120)


def test_a_library_planted_in_a_world_writable_cache_is_never_loaded(tmp_path):
    shared = tmp_path / "shared"
    (shared / "ops").mkdir(parents=True)
    for folder in (shared, shared / "ops"):
        folder.chmod(0o777)
    marker = tmp_path / "planted-code-ran"
    plant_library(shared / "ops" / _library_name(tmp_path), marker)
    env = {k: v for k, v in os.environ.items() if k != "ORTFUSE_OPS_LIBRARY"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os
        from ortfuse.custom_ops.aot import library
        assert library.loaded() is None
        assert not os.path.exists({str(marker)!r}), "the planted library was loaded"
        assert not library.build_in_background()  # nothing is built into a refused cache either
    """)], capture_output=True, text=True, env={**env, "ORTFUSE_CACHE_DIR": str(shared)}, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not marker.exists()
    assert "writable by other users" in proc.stderr and "runs without that cache" in proc.stderr


def test_a_refused_cache_still_fuses_and_leaves_it_untouched(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(shared))
    path = str(tmp_path / "cnn.onnx")
    onnx.save(tiny_cnn(1), path)
    with pytest.warns(RuntimeWarning, match="writable by other users"):
        session = ortfuse.InferenceSession(path, fusion=True)
    assert session.fusion_report.applied
    np.testing.assert_allclose(session.run(None, cnn_feed())[0], stock(path), **TOL)
    assert list(shared.iterdir()) == []


def test_a_cache_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    from ortfuse.foundation import cache_paths

    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path / "theirs"))
    (tmp_path / "theirs").mkdir(mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(tmp_path / "theirs").st_uid + 1)  # as another user sees it
    with pytest.warns(RuntimeWarning, match="owned by another user"):
        folder = cache_paths.cache_dir(cache_paths.PLANS)
    assert tmp_path not in folder.parents and cache_paths.in_scratch(folder)


def test_numba_cache_folder_writable_by_others_is_refused(tmp_path, monkeypatch):
    from ortfuse.custom_ops import numba_setup

    shared = tmp_path / "numba"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(shared))
    with pytest.warns(RuntimeWarning, match="NUMBA_CACHE_DIR"):
        root = numba_setup.cache_root()
    assert pathlib.Path(root) != shared and shared not in pathlib.Path(root).parents


# ------------------------------------------------------------------ 3. only load what we built

def test_a_configured_library_that_is_not_ortfuse_s_is_refused_before_it_loads(tmp_path, monkeypatch):
    from ortfuse.custom_ops.aot import library

    marker = tmp_path / "planted-code-ran"
    plant_library(tmp_path / "libother.so", marker)
    monkeypatch.setenv(library.ENV, str(tmp_path / "libother.so"))
    with pytest.raises(library.LibraryError, match="not an ortfuse ops library of this version"):
        library.library_path()
    proc = python("""
        from ortfuse.custom_ops.aot import library
        assert library.loaded() is None
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not an ortfuse ops library of this version" in proc.stderr
    assert not marker.exists()


@pytest.mark.parametrize("tamper", ["none", "bytes", "key"])
def test_a_cache_library_loads_only_with_the_record_of_its_build(tmp_path, tamper):
    """The run's library copied into a fresh cache under this machine's name, with the record of its
    build: loaded as it is; changed after its build, or recorded with another key, not loaded."""
    from ortfuse.custom_ops.aot import library

    built = pathlib.Path(library.library_path())  # the run's library (tests/conftest.py)
    cache = tmp_path / "cache"
    target = cache / "ops" / _library_name(tmp_path)
    target.parent.mkdir(parents=True)
    data = built.read_bytes()
    target.write_bytes(data + (b"\0" if tamper == "bytes" else b""))
    target.chmod(0o600)
    record = {"key": "0" * 20 if tamper == "key" else target.name.rsplit("-", 1)[1][:-3],
              "sha256": hashlib.sha256(data).hexdigest()}
    pathlib.Path(str(target) + ".json").write_text(json.dumps(record))
    env = {k: v for k, v in os.environ.items() if k != library.ENV}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from ortfuse.custom_ops.aot import library
        library.build_in_background = lambda: False  # no rebuild from the test
        print("loaded" if library.loaded() is not None else "refused")
    """)], capture_output=True, text=True, env={**env, "ORTFUSE_CACHE_DIR": str(cache)}, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == ("loaded" if tamper == "none" else "refused"), proc.stderr[-2000:]
    if tamper != "none":
        assert "not the file ortfuse built there" in proc.stderr


# ------------------------------------------------------------------ 4. children start clean

def _fused_with_native_ops() -> onnx.ModelProto:
    from ortfuse.tune import kernel_compile

    fused, report = ortfuse.fuse(ffn_matmul_add_relu())
    assert report.applied and kernel_compile.needs_kernels(fused)
    return fused


def test_a_child_imports_nothing_from_the_working_directory(tmp_path, monkeypatch):
    from ortfuse.tune import kernel_compile

    marker = tmp_path / "planted-module-ran"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for name in ("onnx", "numpy", "runpy"):  # what the compiling child imports first
        (cwd / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise ImportError('planted')\n")
    monkeypatch.chdir(cwd)
    assert kernel_compile.compile_kernels(_fused_with_native_ops()) == ""
    assert not marker.exists()


def test_a_stopped_child_does_not_outlive_its_parent(tmp_path):
    """The parent stops its compiling child (as during a served run) and dies at once: the child
    must end too, stopped or not."""
    path = tmp_path / "fused.onnx"
    onnx.save(_fused_with_native_ops(), str(path))
    proc = python(f"""
        import os, signal, sys, onnx
        from ortfuse.tune import kernel_compile

        def on_start(child):
            if child is not None:
                os.kill(child.pid, signal.SIGSTOP)
                print(child.pid, flush=True)
                os._exit(0)

        kernel_compile.compile_kernels(onnx.load({str(path)!r}), on_start=on_start)
        sys.exit("the child ended before it could be stopped")
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pid = int(proc.stdout.split()[-1])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid)
    finally:
        if _alive(pid):  # the test failed: leave no stopped process behind
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs or is stopped (a zombie has ended; its reaper may be slow in a container)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------ 7. concurrent processes

WRITER = """
import sys
from ortfuse.kernel_choice import ranking
from ortfuse.layout import choice_cache
tag, n = sys.argv[1], int(sys.argv[2])
sys.stdin.readline()  # both writers start together
for i in range(n):
    choice_cache.remember(f"{tag}-{i}", True, [0.9])
    ranking.record({f"{tag}|{i}|float32": {"order": ["native", "ort"]}})
"""


def test_two_processes_merging_one_cache_lose_no_entry(tmp_path):
    """Layout choices and the kernel ranking are read, merged and written by every process that
    times something: two writers at once keep every entry of both."""
    from ortfuse.kernel_choice import ranking
    from ortfuse.layout import choice_cache

    n = 150
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, tag, str(n)], stdin=subprocess.PIPE, text=True)
               for tag in ("a", "b")]
    for w in writers:
        w.stdin.write("go\n")
        w.stdin.flush()
    assert [w.wait(timeout=300) for w in writers] == [0, 0]
    choices = json.loads(choice_cache.path().read_text())["choices"]
    classes = json.loads(ranking.path().read_text())["classes"]
    assert len(choices) == 2 * n and len(classes) == 2 * n


def test_a_plan_a_live_process_serves_is_never_trimmed(tmp_path, monkeypatch):
    path = str(tmp_path / "cnn.onnx")
    onnx.save(tiny_cnn(1), path)
    server = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, ortfuse
        session = ortfuse.InferenceSession({path!r}, fusion=True)
        print(session._model_path, flush=True)
        sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        served = pathlib.Path(server.stdout.readline().strip())
        assert served.parent == plan_cache.root()
        monkeypatch.setattr(plan_cache, "MAX_BYTES", 1)  # every other entry over the limit
        os.utime(served.with_suffix(".json"), ns=(1, 1))  # and the oldest
        other = str(tmp_path / "other.onnx")
        onnx.save(tiny_cnn(2), other)
        ortfuse.InferenceSession(other, fusion=True)  # stores a plan and trims
        assert served.exists() and served.with_suffix(".json").exists()
    finally:
        server.communicate("done\n", timeout=60)
    ortfuse.InferenceSession(path, fusion=True, fusion_patterns=["add_relu"])  # stores another, trims again
    assert not served.exists()  # no process holds it any more


# ------------------------------------------------------------------ 6. bounded memory

def test_external_data_beyond_the_protobuf_limit_is_left_to_ort_unread(tmp_path, monkeypatch):
    """Its sizes are summed before anything is read: a model that cannot be one message is never loaded."""
    from ortfuse.runtime import planning

    rows = (2**31 // 4) // 1024 + 1  # float32 [rows, 1024]: just over 2 GiB
    weights = numpy_helper.from_array(np.zeros((1, 1024), np.float32), "w")
    weights.ClearField("raw_data")
    weights.dims[:] = [rows, 1024]
    weights.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", "w.bin"), ("offset", "0"), ("length", str(rows * 1024 * 4))):
        entry = weights.external_data.add()
        entry.key, entry.value = k, v
    with open(tmp_path / "w.bin", "wb") as fh:  # sparse: no disk or memory spent
        fh.truncate(rows * 1024 * 4)
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [rows, 1024])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [rows, 1024])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                              "big", [x], [y], [weights])
    path = tmp_path / "big.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())

    def refuse(*args, **kwargs):
        raise AssertionError("the external data was read")

    monkeypatch.setattr(onnx, "load_external_data_for_model", refuse)
    with pytest.warns(UserWarning, match="beyond protobuf's 2 GiB limit"):
        plan, report = planning.plan_fusion(str(path), None, True, None)
    assert plan is None and report.stepped_aside and "2.0 GiB" in report.reason
