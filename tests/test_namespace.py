"""``import ortfuse as ort`` gives every public name of ``onnxruntime``; only the session differs, and
``SessionOptions``, ORT's class recording what ORT cannot read back so that ortfuse copies the options
instead of changing them (``ortfuse.runtime.options_copy``)."""

import onnxruntime

import ortfuse

OWN = {"InferenceSession", "backend", "SessionOptions"}


def test_every_public_onnxruntime_name_is_reexported():
    public = {n for n in dir(onnxruntime) if not n.startswith("_")}
    missing = sorted(n for n in public if not hasattr(ortfuse, n))
    assert not missing, f"ortfuse lacks onnxruntime names: {missing}"
    differing = sorted(n for n in public - OWN if getattr(ortfuse, n) is not getattr(onnxruntime, n))
    assert not differing, f"ortfuse re-exports other objects under these names: {differing}"


def test_named_essentials_are_the_same_objects():
    for name in ("GraphOptimizationLevel", "RunOptions", "OrtValue", "IOBinding",
                 "get_available_providers", "get_device", "SparseTensor", "ExecutionMode"):
        assert getattr(ortfuse, name) is getattr(onnxruntime, name), name


def test_own_names_are_ortfuse_objects():
    assert ortfuse.InferenceSession is not onnxruntime.InferenceSession
    assert issubclass(ortfuse.InferenceSession, onnxruntime.InferenceSession)
    assert issubclass(ortfuse.SessionOptions, onnxruntime.SessionOptions)
    assert isinstance(ortfuse.SessionOptions(), onnxruntime.SessionOptions)
    assert ortfuse.backend.__name__ == "ortfuse.backend"
    for fn in ("prepare", "run_model", "run_node", "supports_device", "is_compatible"):
        assert callable(getattr(ortfuse.backend, fn)), fn


def test_version_is_onnxruntimes_and_ortfuses_own_has_a_name_of_its_own():
    """Code that checks ``ort.__version__`` checks the ORT it runs on; every place ortfuse names its
    own version (the CLI, the metadata it writes, the bench's environment) names ``ortfuse_version``."""
    import importlib.metadata
    import subprocess
    import sys

    from ortfuse.bench.environment import environment
    from ortfuse.ir import metadata

    from model_fixtures import ffn_matmul_add_relu

    assert ortfuse.__version__ == onnxruntime.__version__
    assert ortfuse.ortfuse_version == importlib.metadata.version("ortfuse")
    out = subprocess.run([sys.executable, "-m", "ortfuse", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"ortfuse {ortfuse.ortfuse_version}"
    fused, report = ortfuse.fuse(ffn_matmul_add_relu())
    assert report.applied and metadata.read_props(fused)[metadata.ORTFUSE_VERSION] == ortfuse.ortfuse_version
    assert environment()["versions"]["ortfuse"] == ortfuse.ortfuse_version


def test_import_and_unannotated_sessions_do_not_load_onnx(tmp_path):
    """`import ortfuse` costs what `import onnxruntime` costs: onnx (slow to import) loads only when a
    model must be parsed, never for an unannotated model with fusion=None."""
    import subprocess
    import sys

    from model_fixtures import ffn_matmul_add_relu

    path = tmp_path / "m.onnx"
    path.write_bytes(ffn_matmul_add_relu().SerializeToString())
    code = ("import sys, ortfuse; assert 'onnx' not in sys.modules, 'import';"
            f"s = ortfuse.InferenceSession({str(path)!r}); assert 'onnx' not in sys.modules, 'session';"
            "ortfuse.backend; assert 'onnx' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
