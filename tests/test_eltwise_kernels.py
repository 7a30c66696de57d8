"""custom_ops.kernels.eltwise against custom_ops.reference.

Every kernel on odd sizes (0, 1, 7, 17, 1023, 2**20 + 3) with NaN, ±Inf and ±0 mixed in; serial and
parallel paths; in place; strided inputs through the ``run`` wrapper (kernels themselves take
contiguous flat arrays); size mismatches; activation chains; the bias epilogue over rows.

Exact kernels (relu, clip, hardsigmoid, hardswish, add_relu, bias adds) must be bit-identical to the
reference, signs of zeros included. Kernels built on vecmath (gelu, gelu_tanh, silu, sigmoid, tanh,
exp, erf) must give the reference's NaN/Inf pattern and agree elsewhere within the bound of each.

ISA variants: for each ISA this CPU supports, a subprocess with ``isa.numba_env(isa)`` compiles a
kernel, checks it against the reference and reports the vector registers of its assembly.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numba
import numpy as np
import pytest

from ortfuse.custom_ops import reference as R
from ortfuse.custom_ops.kernels import eltwise as E
from ortfuse.custom_ops.kernels import scalar as S
from ortfuse.foundation import isa

F32 = np.float32
SIZES = [0, 1, 7, 17, 1023, (1 << 20) + 3]
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, 3.0, -3.0, 6.0,
                    -6.0], dtype=F32)


def make_input(n: int, seed: int = 0, scale: float = 4.0) -> np.ndarray:
    """Normal(0, scale) floats with the special values at the front and scattered through."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * scale).astype(F32)
    k = min(n, SPECIAL.size)
    x[:k] = SPECIAL[:k]
    if n > 4 * SPECIAL.size:
        x[rng.integers(0, n, SPECIAL.size * 4)] = np.tile(SPECIAL, 4)
    return x


def assert_identical(y: np.ndarray, ref: np.ndarray) -> None:
    """Bit-identical up to NaN payloads: same NaNs, same values, same signs of zero."""
    ref = np.asarray(ref, dtype=F32)
    assert y.shape == ref.shape
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    ok = ~np.isnan(ref)
    bad = ok & ((y != ref) | (np.signbit(y) != np.signbit(ref)))
    assert not bad.any(), f"{bad.sum()} differ, first at {np.flatnonzero(bad)[:5]}: {y[bad][:5]} vs {ref[bad][:5]}"


def assert_close(y: np.ndarray, ref: np.ndarray, x: np.ndarray, rtol: float, atol_x: float, atol: float) -> None:
    """Same NaN / ±Inf pattern; elsewhere |y - ref| <= rtol |ref| + atol_x |x| + atol."""
    ref = np.asarray(ref, dtype=F32)
    assert np.array_equal(np.isnan(y), np.isnan(ref)), np.flatnonzero(np.isnan(y) != np.isnan(ref))[:5]
    inf = np.isinf(ref)
    assert np.array_equal(y[inf], ref[inf])
    fin = np.isfinite(ref)
    yf, rf, xf = y[fin].astype(np.float64), ref[fin].astype(np.float64), x[fin].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        err = np.abs(yf - rf) - (rtol * np.abs(rf) + atol_x * np.minimum(np.abs(xf), 3.5e38) + atol)
    worst = int(np.argmax(err)) if err.size else 0
    assert not err.size or err[worst] <= 0, f"x={xf[worst]!r}: {yf[worst]!r} vs reference {rf[worst]!r}"


# name -> (reference, exact?, rtol, atol_x, atol). rtol is 4 ulp (the kernel's few ulp plus the
# reference's). atol_x covers 1 + erf / 1 + tanh near -1 scaled by 0.5 |x|: the reference's erf is
# only within 1.2e-7 absolute (and so the erf kernel gets that as atol), numpy's tanh and ours differ by
# up to an ulp of 1 there. atol 1.2e-38 covers subnormal results the reference flushes to 0.
TINY = 1.2e-38
UNARY = {
    "relu": (R.relu, True, 0, 0, 0),
    "gelu": (R.gelu, False, 4.8e-7, 6.1e-8, TINY),
    "gelu_tanh": (R.gelu_tanh, False, 4.8e-7, 6.1e-8, TINY),
    "silu": (R.silu, False, 4.8e-7, 0, 3.7e-37),  # vecmath.silu_f32 gives -0 below x = -88.38
    "sigmoid": (R.sigmoid, False, 4.8e-7, 0, TINY),
    "tanh": (np.tanh, False, 2.4e-7, 0, TINY),
    "exp": (np.exp, False, 4.8e-7, 0, TINY),
    "erf": (R.erf, False, 4.8e-7, 0, 1.3e-7),
}
APPROX = (4.8e-7, 6.1e-8, TINY)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_reference(name, n):
    ref_fn, exact, *tol = UNARY[name]
    x = make_input(n, seed=n)
    out = np.full(n, 7.0, F32)
    assert E.UNARY_KERNELS[name](x, out) == E.OK
    with np.errstate(all="ignore"):
        ref = ref_fn(x)
    if exact:
        assert_identical(out, ref)
    else:
        assert_close(out, ref, x, *tol)


PARAMS = {
    "clip": [{"lo": 0.0, "hi": 6.0}, {"lo": -1.5, "hi": 2.5}, {"lo": -np.inf, "hi": 0.0}, {"lo": 0.0, "hi": np.nan},
             {"lo": np.nan, "hi": 1.0}, {"lo": 3.0, "hi": -3.0}],
    "hardsigmoid": [{"alpha": 0.2, "beta": 0.5}, {"alpha": 1 / 6, "beta": 0.5}, {"alpha": -0.3, "beta": 0.1}],
    "hardswish": [{"add": 3.0, "lo": 0.0, "hi": 6.0, "div": 6.0}, {"add": 1.0, "lo": -0.5, "hi": 2.0, "div": 3.0},
                  {"add": 3.0, "lo": 0.0, "hi": 6.0, "div": 0.0}],
}
PARAM_REFS = {
    "clip": lambda x, p: R.clip(x, p["lo"], p["hi"]),
    "hardsigmoid": lambda x, p: R.hard_sigmoid(x, p["alpha"], p["beta"]),
    "hardswish": lambda x, p: R.hardswish(x, **p),
}


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name,p", [(k, p) for k, ps in PARAMS.items() for p in ps],
                         ids=lambda v: v if isinstance(v, str) else ",".join(f"{a}={b:g}" for a, b in v.items()))
def test_param_kernels_bit_identical(name, p, n):
    x = make_input(n, seed=n + 1)
    fn, keys = E.PARAM_KERNELS[name]
    out = np.empty(n, F32)
    assert fn(x, out, *(F32(p[k]) for k in keys)) == E.OK
    with np.errstate(all="ignore"):
        assert_identical(out, PARAM_REFS[name](x, p))


@pytest.mark.parametrize("n", SIZES)
def test_add_relu(n):
    a, b = make_input(n, 1), make_input(n, 2)[::-1].copy()
    out = np.empty(n, F32)
    assert E.add_relu(a, b, out) == E.OK
    with np.errstate(invalid="ignore"):
        assert_identical(out, R.add_relu(a, b))


@pytest.mark.parametrize("m,n", [(0, 5), (1, 1), (7, 17), (3, 1023), (1, 70000), (1025, 1023), (70001, 3)])
def test_add_relu_bcast(m, n):
    a = make_input(m * n, 3).reshape(m, n)
    b = make_input(n, 4)[::-1].copy()
    out = np.empty(m * n, F32)
    assert E.add_relu_bcast(a.reshape(-1), b, out) == E.OK
    with np.errstate(invalid="ignore"):
        assert_identical(out.reshape(m, n), R.add_relu(a, b))


KINDS = ["", "relu", "gelu", "gelu_tanh", "clip", "hardsigmoid", "hardswish", "silu", "relu+gelu",
         "clip+silu+relu", "hardswish+relu"]
EXACT_KINDS = {"", "relu", "clip", "hardsigmoid", "hardswish", "hardswish+relu"}


def _act_params(kind):
    if kind.startswith("clip"):
        return 0.0, 6.0
    if "hard" in kind:
        return 1 / 6, 0.5
    return 0.0, 0.0


@pytest.mark.parametrize("kind", KINDS)
def test_encode_activation_round_trip(kind):
    assert E.decode_activation(E.encode_activation(kind)) == kind


def test_encode_activation_rejects_unknown_and_long_chains():
    with pytest.raises(ValueError, match="unknown activation"):
        E.encode_activation("mish")
    with pytest.raises(ValueError, match="more than"):
        E.encode_activation("+".join(["relu"] * (E.MAX_CHAIN + 1)))


@pytest.mark.parametrize("n", [0, 17, 1023, (1 << 20) + 3])
@pytest.mark.parametrize("kind", KINDS)
def test_activation_matches_reference(kind, n):
    x = make_input(n, 5)
    alpha, beta = _act_params(kind)
    out = np.empty(n, F32)
    assert E.activation(x, out, E.encode_activation(kind), F32(alpha), F32(beta)) == E.OK
    with np.errstate(all="ignore"):
        ref = R.activation(x, kind, alpha, beta)
    if kind in EXACT_KINDS:
        assert_identical(out, ref)
    else:
        assert_close(out, ref, x, *APPROX)


@pytest.mark.parametrize("m,n", [(0, 4), (1, 1), (7, 17), (33, 1023), (1, 3000), (4099, 257)])
@pytest.mark.parametrize("kind", ["", "relu", "gelu", "hardswish", "relu+gelu"])
def test_bias_act_rows(kind, m, n):
    """The GEMM epilogue: act(y + b) over the rows of y, in place, against reference.activation."""
    y = make_input(m * n, 6).reshape(m, n)
    b = make_input(n, 7)[::-1].copy()
    alpha, beta = _act_params(kind)
    with np.errstate(all="ignore"):
        ref = R.activation((y + b).astype(F32), kind, alpha, beta)
    flat = y.reshape(-1).copy()
    assert E.bias_act(flat, b, flat, E.encode_activation(kind), F32(alpha), F32(beta)) == E.OK
    if kind in EXACT_KINDS:
        assert_identical(flat.reshape(m, n), ref)
    else:
        assert_close(flat.reshape(m, n), ref, (y + b).astype(F32), *APPROX)


def test_bias_act_without_bias_is_activation():
    x = make_input(1023, 8)
    out = np.empty_like(x)
    assert E.bias_act(x, np.empty(0, F32), out, E.encode_activation("relu"), F32(0), F32(0)) == E.OK
    assert_identical(out, R.relu(x))


@pytest.mark.parametrize("name", ["relu", "gelu", "silu", "hardswish", "add_relu", "add_relu_bcast", "bias_act"])
@pytest.mark.parametrize("n", [E.BLOCK + 1, 3 * E.BLOCK + 17, (1 << 20) + 3])
def test_parallel_equals_serial(name, n):
    """The prange path (parallel_min=0) gives the serial path's bits, across block boundaries."""
    x = make_input(n, 9)
    nb = next(d for d in range(min(n, 4000), 0, -1) if n % d == 0)  # a bias size that divides n
    b = make_input(n if name == "add_relu" else nb, 10)
    kw = {"add": 3.0, "lo": 0.0, "hi": 6.0, "div": 6.0} if name == "hardswish" else {}
    if name == "bias_act":
        kw = {"kind": "relu+gelu"}
    inputs = (x, b) if name in ("add_relu", "add_relu_bcast", "bias_act") else (x,)
    with np.errstate(all="ignore"):
        serial = E.run(name, *inputs, parallel_min=E.SERIAL, **kw)
        parallel = E.run(name, *inputs, parallel_min=0, **kw)
    assert_identical(parallel, serial)


@pytest.mark.parametrize("name", ["relu", "gelu_tanh", "hardswish"])
def test_in_place(name):
    x = make_input(5000, 11)
    kw = {"add": 3.0, "lo": 0.0, "hi": 6.0, "div": 6.0} if name == "hardswish" else {}
    expected = E.run(name, x, **kw)
    y = x.copy()
    E.run(name, y, out=y, **kw)
    assert_identical(y, expected)


def test_strided_inputs_go_through_a_contiguous_copy():
    """Kernels take contiguous flat arrays; ``run`` / ``flat_f32`` copy a strided or transposed input
    first (and reuse a contiguous one as is)."""
    base = make_input(4 * 1023, 12).reshape(4, 1023)
    view = base[:, ::3]
    assert not view.flags.c_contiguous
    flat = E.flat_f32(view)
    assert flat.flags.c_contiguous and not np.shares_memory(flat, base)
    assert np.shares_memory(E.flat_f32(base), base)
    with np.errstate(all="ignore"):
        assert_identical(E.run("relu", view), R.relu(view))
        assert_identical(E.run("hardswish", base.T, add=3, lo=0, hi=6, div=6),
                         R.hardswish(base.T, add=3, lo=0, hi=6, div=6))
        assert_close(E.run("gelu", view), R.gelu(view), view, *APPROX)
        a, b = base.T, base[0].reshape(-1)[:4]
        assert_identical(E.run("add_relu_bcast", a, b), R.add_relu(a, b))
    # float64 input is converted
    assert E.run("relu", np.array([-1.0, 2.0])).dtype == np.float32


def test_size_mismatch_is_an_error_and_writes_nothing():
    x = make_input(17)
    out = np.full(16, 5.0, F32)
    assert E.relu(x, out) == E.ERR_SIZE
    assert E.add_relu(x, x[:16].copy(), np.full(17, 5.0, F32)) == E.ERR_SIZE
    assert E.add_relu_bcast(x, np.ones(5, F32), np.full(17, 5.0, F32)) == E.ERR_SIZE
    assert E.add_relu_bcast(x, np.ones(0, F32), np.full(17, 5.0, F32)) == E.ERR_SIZE
    assert E.bias_act(x, np.ones(5, F32), np.full(17, 5.0, F32), 1, F32(0), F32(0)) == E.ERR_SIZE
    assert E.activation(x, np.empty(17, F32), 15, F32(0), F32(0)) == E.ERR_SIZE  # unknown op code
    assert np.all(out == 5.0)
    with pytest.raises(ValueError, match="rejected"):
        E.run("add_relu", x, x[:3])


def test_zero_size_everywhere():
    z = np.empty(0, F32)
    for name, fn in E.UNARY_KERNELS.items():
        assert fn(z, z) == E.OK, name
    assert E.add_relu(z, z, z) == E.OK
    assert E.add_relu_bcast(z, np.ones(3, F32), z) == E.OK
    assert E.bias_act(z, np.ones(3, F32), z, 1, F32(0), F32(0)) == E.OK


def _fresh_asm(dispatcher, *args) -> str:
    """Assembly of a fresh (uncached) compile of a kernel for the types of ``args`` (numba returns no
    assembly for code loaded from its cache)."""
    fresh = numba.njit(nogil=True, error_model="numpy")(dispatcher.py_func)
    fresh(*args)
    return fresh.inspect_asm(fresh.signatures[0])


ELEMENT_PROBES = {
    "relu": "relu1(x[i])",
    "gelu": "gelu1(x[i])",
    "gelu_tanh": "gelu_tanh1(x[i])",
    "clip": "clip1(x[i], p, q)",
    "hardsigmoid": "hardsigmoid1(x[i], p, q)",
    "hardswish": "x[i] * (clip1(x[i] + p, q, p) / q)",
    "silu": "silu_f32(x[i])",
    "add_relu": "relu1(x[i] + y[i])",
}


@pytest.mark.parametrize("name", sorted(ELEMENT_PROBES))
def test_element_loops_vectorise(name):
    """The loop of each op is packed float32 arithmetic on ymm/zmm registers on this CPU."""
    src = (f"def probe(x, y, out, p, q):\n    for i in range(x.size):\n"
           f"        out[i] = {ELEMENT_PROBES[name]}\n")
    scope = {**vars(S), **vars(E)}
    exec(src, scope)  # noqa: S102 - a probe loop per op
    probe = numba.njit(nogil=True, error_model="numpy")(scope["probe"])
    x = make_input(64)
    probe(x, x.copy(), np.empty_like(x), F32(3.0), F32(6.0))
    asm = probe.inspect_asm(probe.signatures[0])
    assert not re.search(r"call\w*\s+\S*(expf|tanhf|erff)", asm)
    if "avx2" in isa.host_features():
        assert isa.asm_vector_width(asm)["bits"] >= 256
        packed = re.findall(r"\bv(?:fn?m(?:add|sub)\d+|mul|add|sub|div|max|min|cmp\w*|blendv)ps\s+[^\n]*%[yz]mm", asm)
        assert len(packed) >= 2, asm[:2000]


def test_apply_range_has_no_libm_calls_and_is_vector_code():
    x = make_input(64)
    asm = _fresh_asm(E._apply_range, x, np.empty_like(x), 0, 64, E.ACT_GELU, F32(0), F32(0), F32(0), F32(1))
    assert not re.search(r"call\w*\s+\S*(expf|tanhf|erff)", asm)
    if "avx2" in isa.host_features():
        assert isa.asm_vector_width(asm)["bits"] >= 256


@pytest.mark.parametrize("op", ["ACT_GELU", "ACT_SILU", "ACT_EXP"])
def test_math_heavy_loops_use_512bit_vectors_on_avx512(op):
    """vecmath.prefer_512bit: zmm for the transcendental ops even under numba's default target for
    the host, whose LLVM tuning prefers ymm (faster in cache: ``python tools/kernel_bench.py --dispatcher``)."""
    if "avx512f" not in isa.host_features():
        pytest.skip("no AVX-512")
    scope = {"E": E, "F32": F32}
    exec(f"def probe(x, out):\n    E._loops(x, out, E.{op}, F32(0), F32(0), F32(0), F32(1))\n", scope)  # noqa: S102
    probe = numba.njit(nogil=True, error_model="numpy")(scope["probe"])
    x = make_input(64)
    probe(x, np.empty_like(x))
    assert isa.asm_vector_width(probe.inspect_asm(probe.signatures[0]))["zmm"] > 0


def test_in_place_loops_are_vector_code():
    """In place has its own loops: the two-array loops fail LLVM's overlap check when given one
    array twice and fall back to scalar code."""
    x = make_input(64)
    ll = numba.njit(nogil=True, error_model="numpy")(E._loops_ip.py_func)
    ll(x, E.ACT_GELU, F32(0), F32(0), F32(0), F32(1))
    sig = ll.signatures[0]
    assert "vector.memcheck" not in ll.inspect_llvm(sig)
    if "avx2" in isa.host_features():
        assert isa.asm_vector_width(ll.inspect_asm(sig))["bits"] >= 256


# ----------------------------------------------------------------------------------------------
# ISA variants, each compiled in its own process (numba reads its target once per process)
# ----------------------------------------------------------------------------------------------

PROBE = textwrap.dedent("""
    import json, sys
    import numba, numpy as np
    from ortfuse.foundation import isa
    from ortfuse.custom_ops import reference as R
    from ortfuse.custom_ops.kernels import eltwise as E
    x = (np.random.default_rng(0).standard_normal(10007) * 4).astype(np.float32)
    x[:4] = [np.nan, np.inf, -np.inf, -0.0]
    out = np.empty_like(x)
    assert E.gelu(x, out) == E.OK
    ref = R.gelu(x)
    fin = np.isfinite(ref)
    err = float(np.max(np.abs(out[fin] - ref[fin]) / (6.1e-8 * np.abs(x[fin]) + 4.8e-7 * np.abs(ref[fin]) + 1.2e-38)))
    asm = E.gelu.inspect_asm(E.gelu.signatures[0])  # compiled here: the cache folder is new
    print(json.dumps({"cpu": numba.config.CPU_NAME, "width": isa.asm_vector_width(asm), "err": err,
                      "nan_ok": bool(np.array_equal(np.isnan(out), np.isnan(ref)))}))
""")


@pytest.fixture
def isa_cache_dir(tmp_path) -> Path:
    """A new numba cache per variant: the probe inspects the assembly of what it compiled (numba has
    none for code loaded from its cache)."""
    return tmp_path / "numba_cache"


@pytest.mark.parametrize("target", isa.KERNEL_ISAS)
def test_isa_variant_compiles_numerics_and_register_width(target, isa_cache_dir):
    if target not in isa.supported_isas():
        pytest.skip(f"this CPU does not support {target}")
    env = {**os.environ, **isa.numba_env(target), "NUMBA_CACHE_DIR": str(isa_cache_dir)}
    env.pop("ORTFUSE_ISA", None)
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["cpu"] == isa.numba_env(target)["NUMBA_CPU_NAME"]
    assert report["nan_ok"] and report["err"] <= 1.0, report
    width = report["width"]
    assert width["bits"] == isa.VECTOR_BITS[target], width
    if target == "avx2":
        assert width["zmm"] == 0 and width["ymm"] > 0
    if target == "generic":
        assert width["zmm"] == 0 and width["ymm"] == 0


def test_isa_override_and_selection(monkeypatch):
    host = isa.supported_isas()
    monkeypatch.setenv("ORTFUSE_ISA", "generic")
    assert isa.supported_isas() == ["generic"]
    assert isa.select_isa(["avx512", "avx2"]) is None
    monkeypatch.setenv("ORTFUSE_ISA", "avx2")
    assert isa.supported_isas() == (["avx2", "generic"] if "avx2" in host else ["generic"])
    monkeypatch.setenv("ORTFUSE_ISA", "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,avx,sse4.2,sse2,amx_tile")
    assert isa.supported_isas() == ["amx", "avx512", "avx2", "generic"]
    assert isa.select_isa(["avx512", "avx2", "generic"]) == "avx512"  # no AMX kernels: falls through
    assert isa.has("amx-tile") and isa.has("AMX_TILE")
    monkeypatch.setenv("ORTFUSE_ISA", "avx2,generic")
    with pytest.raises(ValueError, match="level name"):
        isa.supported_isas()
    monkeypatch.delenv("ORTFUSE_ISA")
    assert isa.supported_isas() == host
    with pytest.raises(ValueError, match="unknown ISA"):
        isa.numba_env("neon")


def test_isa_detection_agrees_with_proc_cpuinfo():
    if not Path("/proc/cpuinfo").exists():
        pytest.skip("no /proc/cpuinfo")
    proc = isa._from_cpuinfo()
    host = isa.host_features()
    for feature in ("sse2", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512bf16",
                    "amx-tile", "amx-bf16", "amx-int8"):
        assert (feature in proc) == (feature in host), feature
    d = isa.describe()
    assert d["supported_isas"] == isa.supported_isas()
    assert d["amx_kernels"] is ({"amx-tile", "amx-bf16"} <= isa.cpu_features())  # the opt-in bf16 GEMM
