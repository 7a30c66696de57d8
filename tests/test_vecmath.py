"""custom_ops.vecmath: float32 exp / tanh / erf / sigmoid / silu against float64 references, in ulps.

Dense sweeps of each function's interesting range, a strided sweep over all 2**32 float32 bit patterns,
and the special values (±0, ±tiny, ±large, ±Inf, NaN; exp overflow and underflow thresholds). The
bounds asserted are ``vecmath.MAX_ULP``, the maxima measured by the exhaustive sweep
(``python -m ortfuse.custom_ops.vecmath --exhaustive``). Plus: the functions stay float32 and vectorise.
"""

from __future__ import annotations

import math
import re

import numba
import numpy as np
import pytest

from ortfuse.custom_ops import vecmath
from ortfuse.custom_ops.vecmath import (
    MAX_ULP,
    SILU_FLUSH,
    SILU_FLUSH_ABS,
    erf_f32,
    exp_f32,
    sigmoid_f32,
    silu_f32,
    tanh_f32,
    ulp_error,
)
from ortfuse.foundation import isa

F32 = np.float32


@numba.njit(nogil=True, error_model="numpy")
def _map_exp(x, out):
    for i in range(x.size):
        out[i] = exp_f32(x[i])


@numba.njit(nogil=True, error_model="numpy")
def _map_tanh(x, out):
    for i in range(x.size):
        out[i] = tanh_f32(x[i])


@numba.njit(nogil=True, error_model="numpy")
def _map_erf(x, out):
    for i in range(x.size):
        out[i] = erf_f32(x[i])


@numba.njit(nogil=True, error_model="numpy")
def _map_sigmoid(x, out):
    for i in range(x.size):
        out[i] = sigmoid_f32(x[i])


@numba.njit(nogil=True, error_model="numpy")
def _map_silu(x, out):
    for i in range(x.size):
        out[i] = silu_f32(x[i])


MAPS = {"exp": _map_exp, "tanh": _map_tanh, "erf": _map_erf, "sigmoid": _map_sigmoid, "silu": _map_silu}

_erf64 = np.frompyfunc(math.erf, 1, 1)


def _sigmoid64(x):
    x = x.astype(np.float64)
    with np.errstate(over="ignore"):
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


REFS = {
    "exp": lambda x: np.exp(x.astype(np.float64)),
    "tanh": lambda x: np.tanh(x.astype(np.float64)),
    "erf": lambda x: _erf64(x.astype(np.float64)).astype(np.float64),
    "sigmoid": _sigmoid64,
    "silu": lambda x: x.astype(np.float64) / (1.0 + np.exp(-x.astype(np.float64))),
}

# the range where each function is not trivially 0, 1, Inf or x
RANGES = {"exp": (-104.0, 89.0), "tanh": (-9.5, 9.5), "erf": (-4.0, 4.0), "sigmoid": (-104.0, 90.0),
          "silu": (-90.0, 90.0)}


def errors(name: str, x: np.ndarray) -> np.ndarray:
    """ulp errors of ``name`` at x; silu's documented -0 below SILU_FLUSH (to within the rounding of n)
    counts as exact where the exact value is within SILU_FLUSH_ABS of 0."""
    y = evaluate(name, x)
    with np.errstate(all="ignore"):
        ref = REFS[name](x)
        err = ulp_error(y, ref)
    if name == "silu":
        flushed = (x < SILU_FLUSH + 1e-4) & (y == 0) & (np.abs(ref) < SILU_FLUSH_ABS)
        err[flushed] = 0.0
    return err


def evaluate(name: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    MAPS[name](x, out)
    return out


def _dense(name: str, n: int = 1 << 20) -> np.ndarray:
    lo, hi = RANGES[name]
    lin = np.linspace(lo, hi, n, dtype=np.float64).astype(np.float32)
    # near 0 the relative error is what matters: sweep magnitudes log-uniformly as well
    small = np.geomspace(1e-30, 2.0, n // 4).astype(np.float32)
    return np.concatenate([lin, small, -small])


@pytest.mark.parametrize("name", sorted(MAPS))
def test_dense_sweep_within_bound(name):
    x = _dense(name)
    err = errors(name, x)
    worst = int(np.argmax(err))
    assert err[worst] <= MAX_ULP[name], f"{name}({x[worst]!r}): {err[worst]:.3f} ulp > {MAX_ULP[name]}"


@pytest.mark.parametrize("name", sorted(MAPS))
def test_strided_sweep_of_all_bit_patterns(name):
    """Every 4099th float32 bit pattern (over a million inputs spread over all signs, exponents and
    NaN payloads): within the bound, and special values exactly where float64 rounds to them."""
    x = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    err = errors(name, x)
    worst = int(np.argmax(err))
    assert err[worst] <= MAX_ULP[name], f"{name}({x[worst]!r}): {err[worst]:.3f} ulp"


def test_ulp_sweep_tool():
    """The exhaustive-sweep kernel behind the docstring figures, on a slice of the bit patterns."""
    ones = np.array([1.0, 2.0], np.float32).view(np.uint32)
    worst, where, mismatches = vecmath.ulp_sweep("exp", step=97, start=int(ones[0]), stop=int(ones[1]))
    assert mismatches == 0 and 0 < worst <= MAX_ULP["exp"] and 1.0 <= where < 2.0


SPECIALS = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-38, -1e-38, 1.1754944e-38, 1e-20, -1e-20, 0.5, -0.5,
                     1.0, -1.0, 3.0, -3.0, 20.0, -20.0, 87.0, -87.0, 88.72283, 88.72284, 89.0, -103.0,
                     -103.972, -104.0, 1e10, -1e10, 3.4028235e38, -3.4028235e38, np.inf, -np.inf, np.nan],
                    dtype=np.float32)


@pytest.mark.parametrize("name", sorted(MAPS))
def test_special_values(name):
    y = evaluate(name, SPECIALS)
    err = errors(name, SPECIALS)
    assert np.all(err <= MAX_ULP[name]), list(zip(SPECIALS[err > MAX_ULP[name]], y[err > MAX_ULP[name]]))
    assert np.isnan(y[-1])  # NaN in, NaN out
    if name in ("tanh", "erf"):  # odd functions keep the sign of zero
        assert np.signbit(y[1]) and not np.signbit(y[0])
        assert y[SPECIALS == np.inf][0] == 1 and y[SPECIALS == -np.inf][0] == -1


def test_exp_overflow_and_underflow_like_numpy():
    x = np.concatenate([np.linspace(80, 120, 4001), np.linspace(-120, -80, 4001),
                        [88.72283, 88.722839, 88.72284, -103.97207, -103.97208, -87.33654, -87.33655]]
                       ).astype(np.float32)
    y = evaluate("exp", x)
    with np.errstate(over="ignore", under="ignore"):
        ref = np.exp(x)  # numpy float32
    assert np.array_equal(np.isinf(y), np.isinf(ref))
    assert np.array_equal(y == 0, ref == 0)
    assert evaluate("exp", np.array([np.inf, -np.inf], np.float32)).tolist() == [np.inf, 0.0]


def test_sigmoid_limits():
    y = evaluate("sigmoid", np.array([np.inf, -np.inf, 100.0, -100.0, -0.0], np.float32))
    assert y[0] == 1 and y[1] == 0 and y[2] == 1
    assert 0 < y[3] < 1e-40            # subnormal, not flushed to 0
    assert y[4] == 0.5


def test_silu_limits_and_flush():
    """silu(+Inf) = +Inf, silu(-Inf) = NaN (x * sigmoid(x) = -Inf * 0, as numpy and ORT give); -0 from
    below SILU_FLUSH on, where every exact value is within SILU_FLUSH_ABS of 0; accurate just above."""
    y = evaluate("silu", np.array([np.inf, -np.inf, 1e30, -1e30, -100.0, -89.0, -0.0, 0.0], np.float32))
    assert y[0] == np.inf and np.isnan(y[1]) and y[2] == np.float32(1e30)
    assert np.all(y[3:6] == 0) and np.all(np.signbit(y[3:7])) and not np.signbit(y[7])
    below = np.linspace(-90.0, SILU_FLUSH - 1e-4, 10001).astype(np.float32)
    assert np.all(evaluate("silu", below) == 0)
    assert np.all(np.abs(REFS["silu"](below)) < SILU_FLUSH_ABS)
    above = np.linspace(SILU_FLUSH + 1e-4, -80.0, 10001).astype(np.float32)
    assert ulp_error(evaluate("silu", above), REFS["silu"](above)).max() <= MAX_ULP["silu"]


def test_ulp_error_definition():
    one = np.array([1.0], np.float32)
    assert ulp_error(np.nextafter(one, F32(2)), np.array([1.0]))[0] == pytest.approx(1.0)
    assert ulp_error(np.array([np.inf], np.float32), np.array([1e300]))[0] == 0
    assert ulp_error(np.array([3e38], np.float32), np.array([1e300]))[0] == np.inf
    assert ulp_error(np.array([np.nan], np.float32), np.array([np.nan]))[0] == 0
    assert ulp_error(np.array([1e-45], np.float32), np.array([0.0]))[0] == pytest.approx(1.0)


@pytest.mark.parametrize("fn", [exp_f32, tanh_f32, erf_f32, sigmoid_f32, silu_f32], ids=lambda f: f.__name__)
def test_stays_float32(fn):
    fn(F32(0.25))
    sigs = fn.nopython_signatures
    assert sigs and all(s.return_type == numba.float32 for s in sigs)


@pytest.mark.parametrize("name", sorted(MAPS))
def test_vectorises_without_libm_calls(name):
    """The loop over the function is vector code (ymm or zmm on an AVX2/AVX-512 host) and calls no
    scalar libm function."""
    kernel = MAPS[name]
    evaluate(name, np.ones(4, np.float32))
    asm = kernel.inspect_asm(kernel.signatures[0])
    assert not re.search(r"call\w*\s+\S*(expf|tanhf|erff|exp|tanh|erf|ldexpf?)\b", asm)
    width = isa.asm_vector_width(asm)
    if "avx2" in isa.host_features():
        assert width["bits"] >= 256, width
        # packed single-precision arithmetic on full-width registers, not a stray vector move
        packed = re.findall(r"\bv(?:fn?m(?:add|sub)\d+|mul|add|sub|div|max|min)ps\s+[^\n]*%[yz]mm", asm)
        assert len(packed) >= 8, len(packed)


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "silu"])
def test_division_and_scaling(name):
    """tanh, sigmoid and silu divide once per element (``divps``, which runs beside the other
    instructions on its own unit), exp not at all; none scales by 2**n with a libm call."""
    kernel = MAPS[name]
    evaluate(name, np.ones(4, np.float32))
    asm = kernel.inspect_asm(kernel.signatures[0])
    assert bool(re.search(r"\bv?div[sp]s\b", asm)) == (name != "exp")
    assert "ldexp" not in asm



@pytest.mark.parametrize("target", [t for t in isa.KERNEL_ISAS if t != "amx"])
def test_every_isa_variant_within_the_bounds(target, tmp_path):
    """Each ISA variant this CPU runs, compiled in a fresh process for it (numba's target flags), stays
    within MAX_ULP over every 4099th bit pattern; without FMA (generic) the errors are the larger
    ones, which is where the bounds come from (the exhaustive sweeps in the module docstring)."""
    import json
    import os
    import subprocess
    import sys

    if target not in isa.supported_isas():
        pytest.skip(f"this CPU does not support {target}")
    code = ("import json; from ortfuse.custom_ops import vecmath as v; "
            "print(json.dumps({n: v.ulp_sweep(n, 4099)[::2] for n in v.MAX_ULP}))")
    env = {**os.environ, **isa.numba_env(target), "NUMBA_CACHE_DIR": str(tmp_path)}
    env.pop("ORTFUSE_ISA", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, (worst, mismatches) in result.items():
        assert mismatches == 0 and 0 < worst <= MAX_ULP[name], (target, name, worst, mismatches)
