"""One model replica of the Ray Serve deployment: a session, its runs, and dynamic batching.

Contract:
- each replica opens the model once: ``fusion="auto"`` and ``True`` through
  ``ortfuse.InferenceSession`` (``auto`` with the plan store as its ``ortfuse.plan_store`` entry,
  so replicas tune each (model, CPU fingerprint, versions) once and one started after the plan is
  published serves fused from its first request; none given: the replica's ``ORTFUSE_PLAN_STORE``,
  else ``<cache>/plan-store`` of its host), ``False`` through ``onnxruntime.InferenceSession``
  itself (stock ORT); ``threads`` intra-op threads, the CPUs Ray reserves for the replica; ``dims``
  (``"name=value,..."``) the sizes served, the ortfuse sessions' ``ortfuse.tune_dims`` entry;
- ``infer(feeds)`` takes inputs already checked against ``signature`` (the ingress does it) and
  returns a ``Reply``, never raises: an error ORT reports as an invalid argument is a 400, any other
  a retriable 500;
- a model that batches (``batching.batchable``) runs the requests that arrive together
  (``@serve.batch``: up to ``max_batch`` requests, waiting at most ``batch_wait_s`` for them) as one
  run per group of equal shapes; any other runs each request on its own. One run at a time per
  replica: its threads are the CPUs it holds;
- every reply says which replica ran it, the replica's count of requests at its arrival, whether the
  session was fused when the run started, the batch size and the run's time.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import onnxruntime
from ray import serve

from ortfuse.foundation.messages import one_sentence
from ortfuse.serve import batching
from ortfuse.serve.signature import Signature

Feeds = dict[str, np.ndarray]
DEFAULT_STORE = "plan-store"  # a fusion="auto" replica's plan store when none is given: <cache>/plan-store


@dataclass
class Reply:
    """What a replica answers the ingress: outputs by name (status 200), or an error sentence."""

    outputs: dict[str, np.ndarray] | None = None
    status: int = 200
    message: str = ""
    retriable: bool = False
    meta: dict = field(default_factory=dict)


def open_session(model: str, fusion, plan_store: str | None, threads: int, dims: str = ""):
    """The replica's session (see the module docstring)."""
    if fusion is False:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    import ortfuse
    from ortfuse.foundation.session_options import DIMS_KEY

    options = ortfuse.SessionOptions()
    options.intra_op_num_threads = threads
    if dims:  # the sizes served: the plan's native convs are chosen at them
        options.add_session_config_entry(DIMS_KEY, dims)
    if fusion == "auto":
        from ortfuse.foundation.cache_paths import cache_dir
        from ortfuse.runtime.shared_plans import STORE_ENV, STORE_OPTION

        store = plan_store or (None if os.environ.get(STORE_ENV) else str(cache_dir(DEFAULT_STORE)))
        if store:  # else the replica's environment names it
            options.add_session_config_entry(STORE_OPTION, store)
    return ortfuse.InferenceSession(model, options, providers=["CPUExecutionProvider"], fusion=fusion)


def replica_name() -> str:
    """Ray Serve's id of this replica, or the process id outside a replica (tests)."""
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # RayServeException outside a deployment
        return f"pid{os.getpid()}"


class ModelReplica:
    """The model deployment's class (``deployment.application`` wraps it in ``serve.deployment``)."""

    def __init__(self, model: str, fusion="auto", plan_store: str | None = None, threads: int = 1,
                 max_batch: int = 8, batch_wait_s: float = 0.002, dims: str = "") -> None:
        self.session = open_session(model, fusion, plan_store, threads, dims)
        self.fusion = fusion
        self.signature = Signature.of_session(self.session)
        self.batches = max_batch > 1 and batching.batchable(self.signature)
        self.name = replica_name()
        self.requests = 0
        self.fused_at_start = self.fused()
        self._run_lock = threading.Lock()
        if self.batches:
            self._batched.set_max_batch_size(max_batch)  # type: ignore[attr-defined]
            self._batched.set_batch_wait_timeout_s(batch_wait_s)  # type: ignore[attr-defined]

    def fused(self) -> bool:
        """Whether a run starting now runs a fused plan (a live swap only ever goes from stock to fused)."""
        report = getattr(self.session, "fusion_report", None)
        return bool(report is not None and report.applied)

    def describe(self) -> dict:
        """The model's tensors and this replica's state (the ingress's GET answer)."""
        status = getattr(self.session, "fusion_status", None) or ("fused" if self.fused() else "stock ORT")
        report = getattr(self.session, "fusion_report", None)
        return {**self.signature.as_json(), "batching": self.batches, "fusion": str(self.fusion).lower(),
                "replica": self.name, "fusion_status": status, "fusion_notes": list(report.notes) if report else [],
                "fused_at_start": self.fused_at_start, "requests": self.requests}

    async def infer(self, feeds: Feeds) -> Reply:
        self.requests += 1
        index = self.requests
        if self.batches:
            reply = await self._batched(feeds)
        else:
            reply = await asyncio.to_thread(self.run_one, feeds)
        reply.meta.update(replica=self.name, request=index)
        return reply

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002)
    async def _batched(self, requests: list[Feeds]) -> list[Reply]:
        return await asyncio.to_thread(self.run_batch, requests)

    def run_batch(self, requests: list[Feeds]) -> list[Reply]:
        """Each request's reply, the requests of equal shapes run as one (module docstring)."""
        replies: list[Reply | None] = [None] * len(requests)
        for group in batching.groups(requests):
            members = [requests[i] for i in group]
            if len(members) > 1:
                joined = self.run_one(batching.concat(members))
                names = list(joined.outputs or {})
                parts = batching.split([joined.outputs[n] for n in names], [batching.rows(f) for f in members]) \
                    if joined.outputs is not None else None
                if parts is not None:
                    for i, part in zip(group, parts):
                        replies[i] = Reply(dict(zip(names, part)), meta={**joined.meta, "batch": len(group)})
                    continue
            for i in group:  # alone, or the joined run failed or mixed rows: each request on its own
                replies[i] = self.run_one(requests[i])
        return [r for r in replies if r is not None]

    def run_one(self, feeds: Feeds) -> Reply:
        """One run of the session, as a Reply; one at a time in this replica."""
        names = [spec.name for spec in self.signature.outputs]
        with self._run_lock:
            fused = self.fused()
            start = time.perf_counter()
            try:
                outputs = self.session.run(names, feeds)
            except onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument as exc:
                return Reply(status=400, message=f"the model rejected the inputs ({one_sentence(exc)}): send inputs "
                             "of the shapes and values the model was made for", meta={"fused": fused})
            except Exception as exc:
                return Reply(status=500, retriable=True, message=f"the model failed on replica {self.name} "
                             f"({one_sentence(exc)}): send the request again; if it fails again, the inputs are "
                             "outside what the model handles", meta={"fused": fused})
            seconds = time.perf_counter() - start
        return Reply(dict(zip(names, outputs)), meta={"fused": fused, "batch": 1, "run_ms": round(seconds * 1e3, 3)})
