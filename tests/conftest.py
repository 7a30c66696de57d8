"""Project-wide pytest hooks."""

from __future__ import annotations


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
    cases = sum(s["cases"] for s in shards)
    devices: dict[str, int] = {}
    counts: dict[str, dict[str, int]] = {}
    fused = sum(s["fused_sessions"] for s in shards)
    for shard in shards:
        for device, n in shard["devices"].items():
            devices[device] = devices.get(device, 0) + n
        for backend, per_kind in shard["counts"].items():
            for kind, n in per_kind.items():
                counts.setdefault(backend, {}).setdefault(kind, 0)
                counts[backend][kind] += n
    terminalreporter.section("ONNX backend test suite parity")
    per_device = " + ".join(f"{n} {d}" for d, n in sorted(devices.items()))
    terminalreporter.write_line(f"{len(shards)} shards, {cases} cases ({per_device})")
    for backend, per_kind in counts.items():
        parts = ", ".join(f"{per_kind.get(k, 0)} {k}" for k in ("passed", "failed", "skipped"))
        terminalreporter.write_line(f"{backend}.backend: {parts}")
    terminalreporter.write_line(f"ortfuse sessions with a fusion applied: {fused}")
