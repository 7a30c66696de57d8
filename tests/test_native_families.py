"""The native op families (custom_ops/native/ops/): the table of native ops is derived from the family
modules, importing them compiles nothing and sets nothing up (numba is configured by an explicit
call), and a family module dropped into the package is found, registered and run with no other edit."""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ortfuse.custom_ops.native import availability
from ortfuse.custom_ops.native.op_def import NativeOpDef
from ortfuse.custom_ops.registration import FAMILY_PACKAGE, native_op_table

pytestmark = pytest.mark.skipif(availability.unavailable_reason() is not None,
                                reason=f"native path unavailable: {availability.unavailable_reason()}")


def _run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600, check=False)


def test_table_is_the_union_of_the_family_modules():
    package = importlib.import_module(FAMILY_PACKAGE)
    names = [info.name for info in pkgutil.iter_modules(package.__path__, FAMILY_PACKAGE + ".")]
    families = {n.rsplit(".", 1)[1] for n in names}
    assert {"add_relu", "hardswish", "silu", "gemm", "gemm_bf16", "eltwise_chain"} <= families
    table = native_op_table()
    declared = set()
    for name in names:
        ops = importlib.import_module(name).NATIVE_OPS
        assert isinstance(ops, tuple) and ops and all(isinstance(op, NativeOpDef) for op in ops), name
        for op in ops:
            assert table[op.name] is op, op.name
            assert op.name not in declared, f"{op.name} declared twice"
            declared.add(op.name)
    # anything else in the table was added by a test (registration.add_native_op), never a fused op
    assert all(not n.startswith("Fused") for n in set(table) - declared)


def test_importing_the_native_code_compiles_nothing_and_configures_nothing():
    proc = _run_python("""
        import importlib, pkgutil, sys
        import numba
        from numba.core import caching
        from numba.core.dispatcher import Dispatcher

        def locators():
            return [c.__name__ for c in caching.CacheImpl._locator_classes]

        layer, before = numba.config.THREADING_LAYER, locators()
        from ortfuse.custom_ops.native import install, threads  # the runtime
        from ortfuse.custom_ops.native import ops
        for info in pkgutil.iter_modules(ops.__path__, ops.__name__ + "."):
            importlib.import_module(info.name)
        ours = [(name, obj) for name, m in list(sys.modules.items()) if name.startswith("ortfuse.custom_ops")
                for obj in vars(m).values() if isinstance(obj, Dispatcher)]
        assert ours and not [o for _, o in ours if o.signatures], "compiled on import"
        assert locators() == before and numba.config.THREADING_LAYER == layer, "numba configured on import"
        from ortfuse.custom_ops.numba_setup import configure_numba
        assert configure_numba()
        assert locators()[0] == "OrtfuseCacheLocator"
        # functions decorated before the call cache in the package's folder too
        from ortfuse.custom_ops.native.ops.silu import silu_span
        assert type(silu_span._cache._impl.locator).__name__ == "OrtfuseCacheLocator"
        print("ok", len(ours))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok"), proc.stdout


MISH_FAMILY = '''
"""A unary float32 family written after the template of custom_ops/native/ops/__init__.py."""

import math

import numpy as np
from numba import njit

from ortfuse.custom_ops.native.elementwise import compute_unary, map_span, unary_block
from ortfuse.custom_ops.native.op_def import NativeOpDef
from ortfuse.custom_ops.vecmath import always_inline, exp_f32, tanh_f32

_ZERO = np.float32(0)


@njit(nogil=True, error_model="numpy", cache=True)
def mish1(v):
    always_inline()
    softplus = (v if v > _ZERO else _ZERO) + np.float32(math.log1p(exp_f32(-abs(v))))
    return v * tanh_f32(softplus)


@njit(nogil=True, error_model="numpy", cache=True)
def mish_span(x, y, s, e):
    map_span(x, y, s, e, mish1)


def _mish_worker(args, block):
    _slot, x, y, s, e = unary_block(args, block)
    mish_span(x, y, s, e)


NATIVE_OPS = (NativeOpDef("OrtfuseTestMish", ("X",), compute_unary, _mish_worker),)
'''


def test_a_new_family_module_is_found_and_runs(tmp_path):
    """The contract of custom_ops/native/ops/__init__.py: one new module (here in a folder added to the
    package's path, so that the checkout stays untouched) is a registrable native op."""
    (tmp_path / "families").mkdir()
    (tmp_path / "families" / "test_mish.py").write_text(MISH_FAMILY)
    proc = _run_python(f"""
        import numpy as np, onnxruntime as ort
        from onnx import helper, TensorProto
        from ortfuse.custom_ops.native import ops
        ops.__path__.append({str(tmp_path / "families")!r})
        from ortfuse.custom_ops.registration import native_op_table, register_native, native_unavailable_reason
        assert "OrtfuseTestMish" in native_op_table()
        so = ort.SessionOptions()
        assert register_native(so, ["OrtfuseTestMish"]), native_unavailable_reason(["OrtfuseTestMish"])
        node = helper.make_node("OrtfuseTestMish", ["X"], ["Y"], domain="ai.onnx.contrib")
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)])
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        x = np.linspace(-30, 30, 70007, dtype=np.float32).reshape(7, 10001)
        np.save({str(tmp_path / "y.npy")!r}, sess.run(None, {{"X": x}})[0])
    """)
    assert proc.returncode == 0, proc.stderr
    x = np.linspace(-30, 30, 70007, dtype=np.float32).astype(np.float64)
    want = x * np.tanh(np.log1p(np.exp(x)))
    np.testing.assert_allclose(np.load(tmp_path / "y.npy").reshape(-1), want, rtol=1e-5, atol=1e-6)
