"""tools/kernel_bench.py, main table: the native fused ops run in ORT sessions beside the unfused
subgraph, its A/A copy and the copies the bandwidth is compared with (no timing asserted)."""

from __future__ import annotations

import json

import pytest
import tool_modules

from ortfuse.custom_ops.registration import native_unavailable_reason

pytestmark = pytest.mark.skipif(native_unavailable_reason() is not None, reason="native ops unavailable")


def _bench():
    return tool_modules.load("kernel_bench")  # numba's cache locates its cached functions by module


def test_native_table_runs_the_fused_ops_in_ort_and_checks_them_against_stock_ort(tmp_path):
    out = tmp_path / "rows.json"
    args = ["--small", "2048", "--large", "4096", "--runs", "1", "--repeats", "1", "--threads", "1",
            "--cases", "hardswish,add_relu_bcast,silu_f16", "--gemm", "none,silu", "--json", str(out)]
    assert _bench().main(args) == 0
    result = json.loads(out.read_text())
    rows = {(r["kernel"], r["size"]): r for r in result["rows"]}
    assert {k for k, _ in rows} == {"hardswish", "add_relu_bcast", "silu_f16", "gemm_none", "gemm_silu"}
    assert rows[("silu_f16", "2K")]["op"] == "FusedSiLUF16"
    assert rows[("hardswish", "2K")]["op"] == "FusedHardSwish"
    assert rows[("add_relu_bcast", "4K")]["op"] == "FusedAddRelu"
    assert rows[("gemm_silu", "small 16x256x256")]["op"] == "FusedGemmAct"
    for r in result["rows"]:
        assert r["max_rel_diff_vs_ort"] < 1e-2, r  # GEMMs sum in another order than MLAS
        assert r["fused_ms"] > 0 and r["ort_ms"] > 0 and r["aa_control"] > 0
        assert r["pct_peak"] > 0
        if "gbs" in r:
            assert r["pct_plain_copy"] > 0 and r["peak"] == max(r["copy_gbs"].values())
            assert set(r["copy_gbs"]) == {"ort_identity", "numpy", "numba", "numba_nt"}
    assert result["env"]["loadavg_before"] and result["env"]["loadavg_after"]


def test_nt_copy_copies_every_element_whatever_the_alignment():
    import numpy as np

    bench = _bench()
    src = np.arange(1000, dtype=np.float32)
    for start in (0, 1, 5, 16, 17):
        dst = np.zeros(1000, np.float32)
        view = dst[start:]
        bench._nt_copy(src[start:], view, view.ctypes.data)
        assert np.array_equal(dst[start:], src[start:]) and not dst[:start].any()


def test_plain_copy_loops_store_every_element_and_call_no_memcpy():
    """The plain-store copy reference must stay a loop of stores: as dst[i] = src[i], LLVM turned the
    prange loop into memcpy, which streams at 128M floats (48.7 GB/s at 2 threads, not 27.9)."""
    import numpy as np

    bench = _bench()
    src = np.arange(1, 5001, dtype=np.float32)
    for copy in (bench._copy, bench._par_copy):
        dst = np.zeros_like(src)
        copy(src, dst)
        assert np.array_equal(dst, src)
        asm = copy.inspect_asm(copy.signatures[0])  # the prange loop's gufunc included
        assert "memcpy" not in asm and "memmove" not in asm, copy
