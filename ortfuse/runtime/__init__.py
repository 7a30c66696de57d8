"""What a session needs besides the rewrite (docs/ARCHITECTURE.md §7).

    planning         a session's plan: cache lookup, parse, request, auto rule, layout, stepping aside
    live_tuning      fusion="auto" tuned on live traffic, then an atomic swap of the C session
    plan_cache       fused plans saved per model, request and environment
    op_registration  ortfuse's custom ops registered on SessionOptions, once per options
    reference_runs   runs of models holding reference (Python-op) kernels, guarded
    session_options  the one SessionOptions builder and the config entries ortfuse defines (leaf)
    cache_paths      where every cache lives (leaf)
    files            atomic file writes (leaf)
    versions         the installed versions that key the caches (leaf)
"""
