"""Replicas that share a plan store (config entry ``ortfuse.plan_store`` or ``$ORTFUSE_PLAN_STORE``:
a folder on a shared filesystem, ``foundation.plan_store.DirectoryStore``) tune each plan once.

Contract, for a ``fusion="auto"`` session given a store and no plan file:
- the store key is the sha256 of what a plan made here would be valid for (``plan_artifact.valid_for``:
  model bytes, CPU fingerprint, versions, code digest, settings, environment);
- at creation a plan file published under the key is checked and installed into the local plan
  cache (``plan_artifact.use``), so the session serves fused from its first run;
- else, while the session records feeds for its live tuning, a daemon thread takes the key's lease
  (``LEASE_S`` seconds, ``$ORTFUSE_PLAN_STORE_LEASE_S``, renewed every third of it while this
  replica tunes): the replica holding it tunes as live tuning does, then publishes the plan file
  (``put_atomic``) and releases the lease. The others serve stock ORT, their tuning held
  (``LiveTuning.hold_start``); every ``POLL_S`` seconds they look for the published plan, and swap it
  in live when it is valid (``LiveTuning.adopt``), or take the lease when it expired (its holder
  died) and tune themselves;
- a replica exiting right after its swap waits for its publication, at most ``PUBLISH_WAIT_S``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import threading
import time
import weakref

from ortfuse.foundation.messages import one_sentence
from ortfuse.foundation.plan_store import DirectoryStore, Store
from ortfuse.foundation.session_options import config_entry
from ortfuse.runtime import plan_artifact

STORE_OPTION = "ortfuse.plan_store"  # SessionOptions config entry: the store's folder (wins over the variable)
STORE_ENV = "ORTFUSE_PLAN_STORE"
LEASE_ENV = "ORTFUSE_PLAN_STORE_LEASE_S"
LEASE_S = 60.0  # default lease; a holder that dies leaves the key for this long at most
FINAL_STOCK = ("stock ORT: no fusion measured faster", "stock ORT: no pattern matches this model")  # published too
PUBLISH_WAIT_S = 30.0  # how long interpreter exit waits for a plan being published
POLL_S = 0.5  # how often a waiting replica looks for the published plan (one stat and read of a small file)


_publishing = threading.Condition()
_tuning: set = set()  # live tunings of this process's lease holders (read and set under _publishing)


@atexit.register
def _wait_for_publishing() -> None:
    """A replica that exits right after its tuning swapped the plan in still publishes it: the
    others would otherwise wait for its lease to expire and tune again."""
    with _publishing:  # a tuning still running is stopped (live_tuning's exit handler): nothing to publish
        _publishing.wait_for(lambda: not any(live.wait(0) for live in _tuning), timeout=PUBLISH_WAIT_S)


def lease_seconds() -> float:
    try:
        value = float(os.environ.get(LEASE_ENV, ""))
    except ValueError:
        return LEASE_S
    return value if value > 0 else LEASE_S


def configured(sess_options) -> Store | None:
    """The store the session's options or the environment name, or None."""
    folder = config_entry(sess_options, STORE_OPTION) or os.environ.get(STORE_ENV)
    return DirectoryStore(folder) if folder else None


class SharedPlan:
    """One ``fusion="auto"`` session's part in a shared plan store (see the module docstring)."""

    def __init__(self, store: Store, source: str | bytes, sess_options, fusion_patterns) -> None:
        self.store, self.source, self.options, self.patterns = store, source, sess_options, fusion_patterns
        valid = plan_artifact.valid_for(source, sess_options, fusion_patterns)
        self.key = hashlib.sha256(json.dumps(valid, sort_keys=True).encode()).hexdigest()[:40] if valid else None
        self.tuned_here = False

    def install_published(self) -> tuple[bool, str]:
        """Install the plan published under the key, if any and valid here: (installed, note)."""
        if self.key is None:
            return False, ""
        try:
            raw = self.store.get(self.key)
        except OSError as exc:
            return False, f"plan store not read ({one_sentence(exc)})"
        if raw is None:
            return False, ""
        return plan_artifact.use(f"plan store {self.key}", self.source, self.options, self.patterns, raw=raw)

    def follow(self, session, live) -> None:
        """Take the lease or wait for the plan, in a daemon thread, for the live tuning ``live``."""
        if self.key is None:
            return
        with live.served.lock:
            live.hold_start = True
        ref = weakref.ref(session)
        threading.Thread(target=self._main, args=(ref, live), name="ortfuse-plan-store", daemon=True).start()

    def _main(self, ref, live) -> None:
        ttl = lease_seconds()
        while ref() is not None and not live._stop:
            if self._adopt_published(ref, live):
                return
            lease = self.store.lease(self.key, ttl) if self.key else None
            if lease is not None:
                self._tune_and_publish(ref, live, lease, ttl)
                return
            time.sleep(POLL_S)

    def _adopt_published(self, ref, live) -> bool:
        installed, note = self.install_published()
        if not installed:
            return False
        from ortfuse.runtime.planning import prepare

        prepared = prepare(self.source, self.options, "auto", self.patterns, mode="off")
        prepared.report.notes.append(note)
        if ref() is not None:
            live.adopt(prepared)
        return True

    def _tune_and_publish(self, ref, live, lease, ttl: float) -> None:
        with _publishing:
            _tuning.add(live)
        try:
            if self._adopt_published(ref, live):  # published between the look and the lease
                return
            self.tuned_here = True
            live.release_start()
            while not live.wait(ttl / 3):
                if ref() is None or not lease.renew():
                    return
            session = ref()
            decided = live.served.swapped_at is not None or live.status in FINAL_STOCK
            applied = session is not None and session.fusion_report.applied
            del session
            if decided and ref() is not None and self.key:
                self.store.put_atomic(self.key, self._plan_file(applied))
        except Exception as exc:  # the session serves on; another replica may take the key
            session = ref()
            if session is not None:
                session.fusion_report.notes.append(f"auto: plan store: not published ({one_sentence(exc)})")
        finally:
            lease.release()
            with _publishing:
                _tuning.discard(live)
                _publishing.notify_all()

    def _plan_file(self, applied: bool) -> bytes:
        """The plan this replica's live tuning decided (``applied``: it swapped a fused plan in), as a
        plan file; its decisions read back from the tuning cache, where the live tuning stored them.
        PlanFileError when they are not there or make another plan."""
        from ortfuse.runtime import planning
        from ortfuse.tune import tuner

        model, why_not = planning.load_model(self.source, self.options)
        if model is None:
            raise plan_artifact.PlanFileError(why_not)
        patterns = planning.requested_patterns(model, self.patterns)
        tuning = tuner.tune(model, patterns, self.options, measure=False, any_shapes=True)
        if not tuning.measured:
            raise plan_artifact.PlanFileError("the live tuning's decisions are not in the tuning cache")
        members, _ = plan_artifact.export_members(self.source, self.options, self.patterns, tuning)
        if (len(members) > 1) != applied:
            raise plan_artifact.PlanFileError("the cached decisions make another plan than the one swapped in")
        return plan_artifact.encode(members)
