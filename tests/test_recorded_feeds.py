"""``runtime.recorded_feeds.FeedCopies``: a recorded feed is an own copy of what was served, written
into arrays prepared after the previous run ended when their shapes match, into new ones otherwise;
and a live tuning's recorded samples are the served feeds, value for value."""

from __future__ import annotations

import threading

import numpy as np

import ortfuse
from ortfuse.runtime import live_tuning
from ortfuse.runtime.recorded_feeds import FeedCopies


def _feeds(seed: int, shape=(2, 5)) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal(shape).astype(np.float32), "ids": rng.integers(0, 9, (3,))}


def _prepared(copies: FeedCopies, like: dict) -> None:
    copies.prepare(like, lambda: None)
    copies._thread.join(10)


def test_a_copy_goes_into_the_prepared_arrays_and_owns_its_values():
    copies = FeedCopies()
    first = copies.copy(_feeds(0))
    _prepared(copies, first)
    ready = dict(copies._ready)
    served = _feeds(1)
    got = copies.copy(served)
    assert all(got[k] is ready[k] for k in served)  # no new memory written on the served run's time
    assert all(np.array_equal(got[k], served[k]) and got[k].dtype == served[k].dtype for k in served)
    served["x"][:] = 7.0  # the caller reuses its buffer: the recorded copy keeps what was served
    assert not np.array_equal(got["x"], served["x"])
    assert copies._ready is None  # the prepared arrays are used once
    assert not any(np.shares_memory(copies.copy(served)[k], got[k]) for k in served)


def test_feeds_of_other_shapes_dtypes_or_names_get_new_arrays():
    copies = FeedCopies()
    for other in (_feeds(2, shape=(3, 5)), {**_feeds(2), "ids": np.arange(3, dtype=np.int32)},
                  {"x": _feeds(2)["x"]}):
        _prepared(copies, copies.copy(_feeds(0)))
        ready = dict(copies._ready)
        got = copies.copy(other)
        assert set(got) == set(other) and all(np.array_equal(got[k], other[k]) for k in other)
        assert all(got[k].dtype == other[k].dtype for k in other)
        assert not any(got[k] is ready.get(k) for k in other)
        assert not any(np.shares_memory(got[k], other[k]) for k in other)


def test_the_arrays_are_written_only_after_the_run_has_ended():
    copies = FeedCopies()
    ended = threading.Event()
    copies.prepare(_feeds(0), lambda: ended.wait(10))
    copies._thread.join(0.2)
    assert copies._ready is None and copies._thread.is_alive()  # the run is still in flight
    ended.set()
    copies._thread.join(10)
    assert copies._ready is not None and all(not a.any() for a in copies._ready.values())


def test_the_samples_a_live_tuning_records_are_the_served_feeds(monkeypatch, tmp_path):
    """The session records its first served feeds through FeedCopies (prepared arrays from the
    second feed on); each recorded sample equals the feed served, though the caller reused its array."""
    from model_fixtures import ffn_inputs, ffn_matmul_add_relu

    monkeypatch.setenv("ORTFUSE_CACHE_DIR", str(tmp_path))  # nothing known: the session records
    monkeypatch.setenv("ORTFUSE_TUNE", "background")
    monkeypatch.setattr(live_tuning.LiveTuning, "_start", lambda self: None)  # keep the samples: no tuning
    session = ortfuse.InferenceSession(ffn_matmul_add_relu(), fusion="auto")
    live = session._ortfuse_live
    buffer = {k: v.copy() for k, v in ffn_inputs(seed=0).items()}
    served = []
    for seed in range(live_tuning.SAMPLE_RUNS):
        for k, v in ffn_inputs(seed=seed).items():
            buffer[k][...] = v  # one buffer, rewritten for every request
        session.run(None, buffer)
        served.append({k: v.copy() for k, v in buffer.items()})
        if live._copies._thread is not None:
            live._copies._thread.join(10)
    assert len(live._samples) == live_tuning.SAMPLE_RUNS
    for sample, feed in zip(live._samples, served):
        assert all(np.array_equal(sample[k], feed[k]) for k in feed)
    arrays = [a for s in live._samples for a in s.values()]
    assert len({id(a) for a in arrays}) == len(arrays)  # each sample its own arrays
