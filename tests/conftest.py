"""Project-wide pytest hooks."""

from __future__ import annotations

import collections
import os


def pytest_configure(config):
    """One compiled-kernel cache for the whole run: tests that point ``ORTFUSE_CACHE_DIR`` at a
    temporary folder (plans, models, tuning), in this process or a child, would otherwise make numba
    recompile every kernel there. Tests of the cache location set their own variables."""
    if not os.environ.get("NUMBA_CACHE_DIR"):
        from ortfuse.custom_ops.numba_setup import cache_root

        os.environ["NUMBA_CACHE_DIR"] = cache_root()
    # the kernel choices tests expect are the registry's static ones: a ranking measured on this
    # machine (`ortfuse rank`, in the user's cache) would change them; tests/test_ranking.py turns it on
    os.environ["ORTFUSE_RANKING"] = "off"
    # tests call kernels directly, as the library does after its own explicit set-up call
    from ortfuse.custom_ops.numba_setup import configure_numba

    configure_numba()
    _use_ops_library(config)


def _use_ops_library(config):
    """Sessions in tests load the ahead-of-time ops library, as users' sessions do: built once per
    machine and sources (in the controller, before xdist starts its workers, which inherit the
    variable), and named by path so that tests pointing ORTFUSE_CACHE_DIR elsewhere still use it.
    If it cannot be built, sessions compile in-process and tests/test_aot.py fails with the reason."""
    if os.environ.get("ORTFUSE_OPS_LIBRARY") or hasattr(config, "workerinput"):
        return
    from ortfuse.custom_ops.aot.library import LibraryError, library_path

    try:
        os.environ["ORTFUSE_OPS_LIBRARY"] = str(library_path())
    except LibraryError as exc:  # no background builds from every test process either
        os.environ["ORTFUSE_OPS_LIBRARY"] = "off"
        print(f"ortfuse tests: no ops library ({exc})")


def pytest_terminal_summary(terminalreporter):
    """Sum the per-shard totals of test_onnx_backend_parity.py (works across xdist workers)."""
    shards = [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        for name, value in getattr(report, "user_properties", ())
        if name == "onnx_backend_parity" and getattr(report, "when", "call") == "call"
    ]
    if not shards:
        return
    devices: collections.Counter[str] = collections.Counter()
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for shard in shards:
        devices.update(shard["devices"])
        for backend, per_kind in shard["counts"].items():
            counts[backend].update(per_kind)
    write = terminalreporter.write_line
    terminalreporter.section("ONNX backend test suite parity")
    per_device = " + ".join(f"{n} {d}" for d, n in sorted(devices.items()))
    write(f"{len(shards)} shards, {sum(s['cases'] for s in shards)} cases ({per_device})")
    for backend, per_kind in counts.items():
        write(f"{backend}.backend: " + ", ".join(f"{per_kind[k]} {k}" for k in ("passed", "failed", "skipped")))
    write(f"ortfuse sessions with a fusion applied: {sum(s['fused_sessions'] for s in shards)}")
    write(f"cases with different outcomes: {sum(s['differing'] for s in shards)}")
