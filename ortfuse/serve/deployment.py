"""The Ray Serve application of one model: an ingress deployment (HTTP, ``ingress.Ingress``) in front
of a model deployment (``replica.ModelReplica``, one session per replica). Ray places, restarts and
routes; nothing here schedules.

    from ray import serve
    from ortfuse.serve.deployment import application
    serve.run(application("model.onnx", replicas=2), name="model", route_prefix="/")

The model replicas each reserve ``threads`` CPUs (Ray's ``num_cpus``; the session's intra-op threads)
and accept ``2 * max_batch`` requests at a time (one batch running, the next one forming); the one
ingress replica reserves no CPU and holds many requests, as it only waits on the replicas.
``ray_actor_options`` are merged into the model replicas' (a ``runtime_env`` with environment
variables, for example). A ``fusion="auto"`` deployment without ``plan_store`` uses
``<cache>/plan-store`` on each host: replicas on one machine share it; give a folder on a shared
filesystem for replicas on several hosts.
"""

from __future__ import annotations

from ray import serve

from ortfuse.serve.ingress import ATTEMPTS, Ingress
from ortfuse.serve.replica import ModelReplica

INGRESS_ONGOING = 256  # requests the ingress holds at once; beyond, Ray's proxy queues them


def fusion_value(text: str):
    """``auto|true|false`` as ``InferenceSession``'s ``fusion`` value; ValueError otherwise."""
    values = {"auto": "auto", "true": True, "false": False}
    if text.lower() not in values:
        raise ValueError(f"fusion {text!r} is not one of auto, true, false")
    return values[text.lower()]


def application(model: str, *, replicas: int = 1, fusion="auto", plan_store: str | None = None, threads: int = 1,
                max_batch: int = 8, batch_wait_s: float = 0.002, ray_actor_options: dict | None = None,
                attempts: int = ATTEMPTS, dims: str = ""):
    """The bound application (``serve.run`` it); ``model`` must be a path every replica can read."""
    if replicas < 1 or threads < 1 or max_batch < 1:
        raise ValueError(f"replicas ({replicas}), threads ({threads}) and max_batch ({max_batch}) must be at least 1")
    model_deployment = serve.deployment(
        name="model", num_replicas=replicas, max_ongoing_requests=2 * max_batch,
        ray_actor_options={"num_cpus": threads, **(ray_actor_options or {})})(ModelReplica)
    ingress = serve.deployment(name="ingress", num_replicas=1, max_ongoing_requests=INGRESS_ONGOING,
                               ray_actor_options={"num_cpus": 0})(Ingress)
    replica = model_deployment.bind(model, fusion, plan_store, threads, max_batch, batch_wait_s, dims)
    return ingress.bind(replica, attempts)
