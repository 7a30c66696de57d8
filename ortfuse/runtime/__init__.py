"""What a session needs besides the rewrite (docs/ARCHITECTURE.md §7).

    plan_cache       fused plans saved per model, request and environment
    op_registration  ortfuse's custom ops registered on SessionOptions, once per options
    reference_runs   runs of models holding reference (Python-op) kernels, guarded
    session_options  the one SessionOptions builder and the config entries ortfuse defines (leaf)
    cache_paths      where every cache lives (leaf)
    files            atomic file writes (leaf)
"""
