"""Set-up of tests/test_serve_ray.py's model replicas, run by Ray in each replica's worker process
before the replica opens its session (``runtime_env`` ``worker_process_setup_hook``
``serve_replica_setup.stated_timings``, this folder on the replicas' ``PYTHONPATH``).

Each replica gets a cache of its own under ``$ORTFUSE_TEST_SERVE_DIR`` (a machine of its own: only
the plan store is shared), tunes in its tuning thread with the timings stated as
tests/test_live_tuning.py's ``winning`` fixture states them (every fusion twice as fast as ORT; a
tuning process would not carry them), and appends its pid to ``$ORTFUSE_TEST_SERVE_DIR/tunings``
for every measuring ``tuner.tune`` call: the test counts the tunings of all replicas, killed ones
included, from that file.
"""

from __future__ import annotations

import os

SERVE_DIR = "ORTFUSE_TEST_SERVE_DIR"


def stated_timings() -> None:
    base = os.environ[SERVE_DIR]
    os.environ["ORTFUSE_CACHE_DIR"] = os.path.join(base, f"cache-{os.getpid()}")
    from ortfuse.runtime import live_tuning
    from ortfuse.tune import measure, tuner

    from timing_fixtures import raw_timing

    measure._best_of = lambda f, o, n: (0.5, 1.0)
    measure._time_pair = lambda f, o, budget: (0.5, 1.0, [0.5] * measure.REPEATS)
    measure._time_with_control = lambda f, o, c, budget: raw_timing(0.5, 1.0)
    live_tuning.IN_CHILD = False
    real = tuner.tune

    def counting(*args, **kwargs):
        if kwargs.get("measure"):
            with open(os.path.join(base, "tunings"), "a") as log:
                log.write(f"{os.getpid()}\n")
        return real(*args, **kwargs)

    tuner.tune = counting
