"""``ortfuse serve``: a model behind an HTTP endpoint on Ray Serve, one ``ortfuse.InferenceSession``
per replica (``pip install 'ortfuse[serve]'``; docs/ARCHITECTURE.md §7, README "Serving with Ray").

    signature   the model's tensors, and the check of a request's inputs against them
    codec       the HTTP request and response formats (JSON for small tensors, .npz for large ones)
    batching    which models batch, which requests run together, the split of a batch's outputs
    replica     one model replica: its session (auto replicas share a plan store), runs, @serve.batch
    ingress     the HTTP deployment: requests decoded and checked, sent again when a replica dies
    deployment  the Ray Serve application: the ingress in front of the model replicas
    startup     the local Ray instance on loopback or a cluster joined, Serve's proxy, deploy and stop

``signature``, ``codec`` and ``batching`` import neither Ray nor starlette. The command line is
``ortfuse.cli.serve``.
"""
