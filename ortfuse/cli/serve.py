"""``ortfuse serve MODEL``: the model behind an HTTP endpoint on Ray Serve, one ``ortfuse`` session
per replica (``ortfuse.serve``; ``pip install 'ortfuse[serve]'``).

    ortfuse serve model.onnx --replicas 2                     # a local Ray instance on loopback
    ortfuse serve model.onnx --replicas 8 --address HOST:6379 --plan-store /shared/plans
    ortfuse serve crnn_recognizer --fusion false --port 8001  # stock ORT behind the same deployment

``fusion=auto`` replicas share a plan store (``--plan-store``, default ``<cache>/plan-store`` of each
host): the model is tuned once per CPU fingerprint and versions, and a replica started later serves
fused from its first request. Requests: README, "Serving with Ray". Runs until Ctrl-C / SIGTERM or
``--duration`` seconds, then removes the application (and stops the local Ray instance it started).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import sys
import threading

STARTUP_S = 600  # with --duration: how long starting and stopping may take beyond it before SIGALRM ends it
STOP_S = 120


def add_arguments(p) -> None:
    p.add_argument("model", help="path of the .onnx model (every replica reads it at that path), or a zoo or "
                                 "public model name")
    p.add_argument("--replicas", type=int, default=1, help="model replicas (default 1)")
    p.add_argument("--address", default=None,
                   help="join this Ray cluster (its GCS address, HOST:PORT) instead of starting a local instance")
    p.add_argument("--host", default="127.0.0.1", help="where Serve's HTTP proxy listens (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="Serve's HTTP port (default 8000)")
    p.add_argument("--fusion", default="auto", choices=["auto", "true", "false"],
                   help="auto (default: tuned once per plan store), true (every legal fusion), false (stock ORT)")
    p.add_argument("--plan-store", default=None, metavar="DIR",
                   help="the fusion=auto replicas' shared plan store (default <cache>/plan-store of each host; on "
                        "a cluster, a folder on a filesystem every host shares)")
    p.add_argument("--threads", type=int, default=1, help="CPUs of each replica: Ray's num_cpus and ORT's intra-op "
                                                          "threads (default 1)")
    p.add_argument("--max-batch", type=int, default=8,
                   help="requests run together when every input has a dynamic batch dim (default 8; 1: never)")
    p.add_argument("--batch-wait-ms", type=float, default=2.0,
                   help="how long a batch waits for more requests (default 2 ms)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                   help="a size the replicas serve, by the name the model's input declares (repeat it): "
                        "ortfuse's sessions choose their native convs at it (the ortfuse.tune_dims entry)")
    p.add_argument("--name", default=None, help="the application's name (default: the model file's)")
    p.add_argument("--route-prefix", default="/", help="the URL path it is served at (default /)")
    p.add_argument("--object-store-mb", type=int, default=None,
                   help="the local instance's object store (default 512 MB)")
    p.add_argument("--num-cpus", type=int, default=None,
                   help="the local instance's CPUs that replicas reserve (default: this machine's)")
    p.add_argument("--runtime-env-json", default=None, metavar="JSON",
                   help="a Ray runtime_env for the model replicas, e.g. '{\"env_vars\": {\"ORTFUSE_TUNE\": \"sync\"}}'")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="stop after S seconds of serving (default: run until Ctrl-C or SIGTERM); the process ends "
                        "at the latest 12 minutes later, however its start or stop goes")


def run(args) -> int:
    if not _serve_installed():
        print("ortfuse serve: Ray Serve is not installed: pip install 'ortfuse[serve]'", file=sys.stderr)
        return 2
    try:
        path, signature, options = _checked(args)
    except ValueError as exc:
        print(f"ortfuse serve: {exc}", file=sys.stderr)
        return 2
    from ortfuse.serve import startup  # imports no Ray: connect sets the loopback switch before Ray's import

    if args.duration is not None:  # the process ends by then however its start or stop goes (SIGALRM)
        signal.alarm(int(STARTUP_S + args.duration + STOP_S))
    stop = threading.Event()
    served = None
    try:
        local = startup.connect(args.address, num_cpus=args.num_cpus,
                                **({"object_store_mb": args.object_store_mb} if args.object_store_mb else {}))
        from ortfuse.serve import deployment

        app = deployment.application(path, replicas=args.replicas, fusion=deployment.fusion_value(args.fusion),
                                     plan_store=options["plan_store"], threads=args.threads,
                                     max_batch=args.max_batch, batch_wait_s=args.batch_wait_ms / 1e3,
                                     ray_actor_options=options["actor"], dims=options["dims"])
        served = startup.deploy(app, options["name"], args.route_prefix, args.host, args.port, local)
        for number in (signal.SIGINT, signal.SIGTERM):  # from now on a signal stops the serving cleanly
            signal.signal(number, lambda *_: stop.set())
        _print_ready(args, path, signature, served, options["plan_store"])
        stop.wait(args.duration)
    except KeyboardInterrupt:
        print("ortfuse serve: interrupted while starting", file=sys.stderr)
        return 130
    except startup.ServeError as exc:
        print(f"ortfuse serve: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # Ray's failures to start or deploy (a replica that cannot open the model, ...)
        from ortfuse.foundation.messages import one_sentence

        print(f"ortfuse serve: serving failed ({one_sentence(exc)}); Ray's logs say more", file=sys.stderr)
        return 1
    finally:
        if served is not None:
            startup.stop(served)
            print("ortfuse serve: stopped", flush=True)
        else:
            _disconnect()
    return 0


def _serve_installed() -> bool:
    """Ray with its Serve extra, without importing Ray (startup.connect must set its loopback switch first;
    ``find_spec("ray.serve")`` would import ``ray``)."""
    spec = importlib.util.find_spec("ray")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    return any(os.path.isdir(os.path.join(f, "serve")) for f in folders) and importlib.util.find_spec("starlette") \
        is not None


def _checked(args) -> tuple[str, object, dict]:
    """The model's path, its signature read by stock ORT here, and the deployment's options; ValueError
    with one sentence for anything that would only fail on the replicas."""
    import onnxruntime as ort

    from ortfuse import models
    from ortfuse.serve.signature import Signature

    if args.replicas < 1 or args.threads < 1 or args.max_batch < 1 or (args.num_cpus or 1) < 1:
        raise ValueError("--replicas, --threads, --max-batch and --num-cpus take 1 or more")
    if args.address and (args.num_cpus or args.object_store_mb):
        raise ValueError("--num-cpus and --object-store-mb size a local instance: a cluster joined with --address "
                         "keeps its own")
    if args.duration is not None and args.duration <= 0:
        raise ValueError(f"--duration {args.duration} is not a positive number of seconds")
    if not args.route_prefix.startswith("/"):
        raise ValueError(f"--route-prefix {args.route_prefix!r} must start with '/'")
    path = os.path.abspath(models.resolve(args.model))  # ModelArgError is a ValueError
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        signature = Signature.of_session(ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]))
    except ValueError:
        raise
    except Exception as exc:
        from ortfuse.foundation.messages import one_sentence

        raise ValueError(f"onnxruntime cannot load {path} ({one_sentence(exc)}): serve a model stock ORT runs"
                         ) from None
    actor = None
    if args.runtime_env_json:
        try:
            actor = {"runtime_env": json.loads(args.runtime_env_json)}
        except ValueError as exc:
            raise ValueError(f"--runtime-env-json is not JSON ({exc}): give an object such as "
                             "'{\"env_vars\": {\"NAME\": \"value\"}}'") from None
        if not isinstance(actor["runtime_env"], dict):
            raise ValueError("--runtime-env-json must be a JSON object (Ray's runtime_env)")
    name = args.name or re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.splitext(os.path.basename(path))[0])
    store = os.path.abspath(args.plan_store) if args.plan_store else None
    from ortfuse.ir.model_args import format_dims, parse_dims

    dims = format_dims(parse_dims(args.dim))  # ModelArgError is a ValueError
    return path, signature, {"actor": actor, "name": name, "plan_store": store, "dims": dims}


def _print_ready(args, path: str, signature, served, store: str | None) -> None:
    from ortfuse.serve import batching

    batches = args.max_batch > 1 and batching.batchable(signature)
    where = "a local Ray instance on loopback" if served.local else f"the Ray cluster at {args.address}"
    store_text = store or "<cache>/plan-store of each host"
    print(f"ortfuse serve: {path} on {args.replicas} replica(s) of {where}, fusion={args.fusion}"
          + (f", plan store {store_text}" if args.fusion == "auto" else ""))
    print(f"  inputs: {signature.inputs_text()}")
    print("  " + (f"dynamic batching: up to {args.max_batch} requests per run" if batches
                  else "one run per request (batching needs a dynamic first dim on every input and output)"))
    print(f"  POST {served.url} with application/json or application/x-npz (README: Serving with Ray); "
          f"GET {served.url}: the model's tensors")
    print(f"  Ray cluster: {served.cluster} (another ortfuse serve joins it: RAY_AUTH_MODE=token ortfuse serve ... "
          f"--address {served.cluster})")
    print(f"ready: {served.url}", flush=True)


def _disconnect() -> None:
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
