"""The shared plan store's directory implementation (``ortfuse.foundation.plan_store``): atomic
publish, one live lease per key, renewal, release, and an expired lease (its holder killed with
SIGKILL, a real process) taken over by another process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ortfuse.foundation.plan_store import DirectoryStore, Store

KEY = "a1b2c3"


def test_publish_is_atomic_and_read_back(tmp_path):
    store = DirectoryStore(tmp_path / "store")
    assert isinstance(store, Store) and store.get(KEY) is None
    store.put_atomic(KEY, b"first")
    store.put_atomic(KEY, b"second plan")
    assert store.get(KEY) == b"second plan"
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [f"{KEY}.plan"]  # no temporary left


@pytest.mark.parametrize("key", ["", "../x", "a/b", "x" * 129, "a.plan"])
def test_keys_that_could_name_other_files_are_refused(tmp_path, key):
    with pytest.raises(ValueError, match="plan store key"):
        DirectoryStore(tmp_path).put_atomic(key, b"x")


def test_one_live_lease_per_key_renewed_and_released(tmp_path):
    store = DirectoryStore(tmp_path)
    lease = store.lease(KEY, ttl_s=60)
    assert lease is not None and lease.expires > time.time() + 50
    assert store.lease(KEY, ttl_s=60) is None and store.lease("other", ttl_s=60) is not None
    record = json.loads((tmp_path / f"{KEY}.lease").read_text())
    assert record["pid"] == os.getpid() and record["host"] and record["expires"] == lease.expires
    assert lease.renew() and store.lease(KEY, ttl_s=60) is None
    lease.release()
    again = store.lease(KEY, ttl_s=60)
    assert again is not None
    assert not lease.renew()  # the released lease is another holder's now
    lease.release()  # a no-op: the new holder keeps it
    assert store.lease(KEY, ttl_s=60) is None


HOLDER = textwrap.dedent("""
    import sys, time
    from ortfuse.foundation.plan_store import DirectoryStore
    lease = DirectoryStore(sys.argv[1]).lease(sys.argv[2], ttl_s=float(sys.argv[3]))
    print("taken" if lease is not None else "refused", flush=True)
    time.sleep(600)
""")


def test_a_lease_whose_holder_was_killed_expires_and_is_taken_over(tmp_path):
    ttl = 2.0
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), KEY, str(ttl)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "taken"
        store = DirectoryStore(tmp_path)
        assert store.lease(KEY, ttl_s=60) is None  # live: its holder runs
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        assert store.lease(KEY, ttl_s=60) is None  # dead, but its lease has not expired yet
        deadline = time.time() + 30 * ttl
        lease = None
        while lease is None and time.time() < deadline:
            time.sleep(0.2)
            lease = store.lease(KEY, ttl_s=60)
        assert lease is not None
        assert json.loads((tmp_path / f"{KEY}.lease").read_text())["pid"] == os.getpid()
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".expired")]
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
