"""Peak memory of one bench configuration, measured alone in a fresh process.

Sessions of all configurations live in the one timing process, where ORT's arenas, numba's caches
and Python's allocator make any RSS change hard to attribute to one session. So ``ortfuse bench``
measures memory separately: for each configuration a child process (``python -m ortfuse.bench.memory
SPEC.json``) imports what one session needs (``ortfuse.bench.sessions``), loads the inputs, then
records its resident set size (baseline), creates the one session and runs it a few times. The peak is
the process's high-water mark of RSS over session creation and runs, minus the baseline: Linux's
``VmHWM`` after resetting it (``/proc/self/clear_refs``), and wherever that is unavailable a psutil
sampler thread (1 ms), whose maximum is also taken into account. The child prints one JSON object on stdout.
"""

from __future__ import annotations

import json
import sys
import threading
import time

MB = 1024.0 * 1024.0


def _reset_hwm() -> bool:
    """Reset the kernel's RSS high-water mark of this process (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _read_hwm() is not None
    except OSError:
        return False


def _read_hwm() -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    return None


class _Sampler(threading.Thread):
    def __init__(self, interval: float = 0.001) -> None:
        super().__init__(daemon=True)
        import psutil

        self._proc = psutil.Process()
        self._interval = interval
        self._stop_event = threading.Event()
        self.peak = self._proc.memory_info().rss

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(self._interval)

    def stop(self) -> float:
        self._stop_event.set()
        self.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)
        return self.peak


def measure_child(spec: dict) -> dict:
    """Run in the child: baseline RSS, create the session, run it, report the peak RSS growth."""
    import numpy as np
    import psutil

    from ortfuse.bench.sessions import make_session  # imports onnxruntime and ortfuse when it makes one

    feeds_file = np.load(spec["inputs"])
    feeds = {k: feeds_file[k] for k in feeds_file.files}
    proc = psutil.Process()
    baseline = proc.memory_info().rss
    hwm_ok = _reset_hwm()
    sampler = _Sampler()
    sampler.start()
    t0 = time.perf_counter()
    sess = make_session(
        spec["config"],
        spec["model"],
        spinning=spec.get("spinning", True),
        threads=spec.get("threads", 0),
        batch=spec.get("batch", 1),
        dims=spec.get("dims"),
    )
    create_s = time.perf_counter() - t0
    after_create = proc.memory_info().rss
    for _ in range(max(1, int(spec.get("runs", 3)))):
        sess.run(None, feeds)
    sampled_peak = sampler.stop()
    hwm = _read_hwm() if hwm_ok else None
    peak = max(sampled_peak, hwm or 0.0)
    return {
        "method": "child process: VmHWM after clear_refs + psutil 1 ms sampler"
        if hwm_ok
        else "child process: psutil 1 ms sampler",
        "baseline_mb": baseline / MB,
        "create_delta_mb": (after_create - baseline) / MB,
        "peak_delta_mb": (peak - baseline) / MB,
        "peak_rss_mb": peak / MB,
        "create_s": create_s,
        "runs": int(spec.get("runs", 3)),
    }


def measure_in_subprocess(spec: dict, spec_path: str, timeout: float = 600.0) -> dict:
    """Parent side: write ``spec`` to ``spec_path``, run the child, return its JSON (or an error)."""
    import subprocess

    with open(spec_path, "w") as f:
        json.dump(spec, f)
    proc = subprocess.run(
        [sys.executable, "-m", "ortfuse.bench.memory", spec_path],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"memory child exited with {proc.returncode}: {' | '.join(tail)}"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"memory child printed no JSON: {proc.stdout[-200:]!r}"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m ortfuse.bench.memory SPEC.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        spec = json.load(f)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = measure_child(spec)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
