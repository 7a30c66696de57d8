"""Starting and stopping ``ortfuse serve``: the Ray instance, Serve's HTTP proxy, the application.

- ``connect(None)`` starts a local Ray instance on this machine that listens on loopback only: Ray
  takes the node's address from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` when it is imported (``0``:
  loopback, as Ray does on one-machine platforms, and its servers then listen on 127.0.0.1), so
  this sets it before importing Ray and checks the node's address after ``ray.init``; no dashboard,
  a bounded object store. ``connect(ADDRESS)`` joins an existing cluster and changes nothing of it
  (on a loopback address this process takes a loopback node address too).
- ``deploy`` starts Serve's proxy (``host``:``port``; on a cluster already serving, its own
  address stands) and runs the application under ``name`` at ``route_prefix``; it returns once
  every replica is up and the route answers a GET.
- ``stop`` deletes the application; on the local instance it shuts Serve and Ray down.
Ray does the distribution: placement, restarts of dead replicas, routing.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node address is loopback (read at its import)
OBJECT_STORE_MB = 512  # the local instance's shared-memory object store (Ray's default is 30% of RAM)
READY_TIMEOUT_S = 30.0  # the route's first GET, once serve.run returned


class ServeError(RuntimeError):
    """``ortfuse serve`` cannot start as asked; the message is one sentence."""


@dataclass
class Served:
    name: str
    url: str
    local: bool  # this process started the Ray instance (stop shuts it down)
    cluster: str  # the GCS address others join with --address
    described: dict  # the route's GET answer: the model's inputs and outputs, one replica's state


def connect(address: str | None = None, object_store_mb: int = OBJECT_STORE_MB, num_cpus: int | None = None,
            temp_dir: str | None = None) -> bool:
    """Start the local loopback instance (``address`` None) or join ``address``; True when started here."""
    if address is None or address.split(":")[0] in (LOOPBACK, "localhost"):
        if "ray" in sys.modules and os.environ.get(LOOPBACK_ENV) != "0":
            raise ServeError(f"Ray was imported in this process before {LOOPBACK_ENV}=0 was set, so it would take "
                             "this machine's network address instead of loopback: set that variable in the "
                             "environment, or connect before importing Ray")
        os.environ[LOOPBACK_ENV] = "0"
    import ray

    if address is not None:
        ray.init(address=address, log_to_driver=False)
        return False
    ray.init(include_dashboard=False, _node_ip_address=LOOPBACK, object_store_memory=object_store_mb << 20,
             num_cpus=num_cpus, _temp_dir=temp_dir, log_to_driver=False)
    node = ray.util.get_node_ip_address()
    if node != LOOPBACK:
        ray.shutdown()
        raise ServeError(f"the local Ray instance took address {node}, not loopback (Ray was imported before "
                         f"{LOOPBACK_ENV}=0 was set): set it in the environment, or start Ray yourself and pass "
                         "--address")
    return True


def deploy(app, name: str, route_prefix: str = "/", host: str = LOOPBACK, port: int = 8000,
           local: bool = True) -> Served:
    """Serve ``app`` (``deployment.application``) and wait until its route answers (module docstring)."""
    import ray
    from ray import serve

    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=name, route_prefix=route_prefix, blocking=False)
    bound_host, bound_port = _http_address(host, port)
    url = f"http://{LOOPBACK if bound_host in ('0.0.0.0', '::') else bound_host}:{bound_port}{route_prefix}"
    try:
        with urllib.request.urlopen(url, timeout=READY_TIMEOUT_S) as answer:
            described = json.loads(answer.read())
    except OSError as exc:
        raise ServeError(f"the application is up but {url} does not answer ({exc}): check that port {bound_port} "
                         "is free and reachable") from None
    return Served(name, url, local, ray.get_runtime_context().gcs_address, described)


def stop(served: Served) -> None:
    import ray
    from ray import serve

    try:
        if served.local:
            serve.shutdown()
        else:
            serve.delete(served.name)
    finally:
        ray.shutdown()


def _http_address(host: str, port: int) -> tuple[str, int]:
    """Where Serve's proxy listens: the options asked for, or those of a Serve already running there."""
    try:
        from ray.serve.context import _get_global_client

        client = _get_global_client()
        if client is None:
            return host, port
        return client.http_config.host, client.http_config.port
    except Exception:  # a private API of Ray's: when it moves, the options asked for
        return host, port
