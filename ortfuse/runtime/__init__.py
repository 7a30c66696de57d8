"""What a session needs besides the rewrite (docs/ARCHITECTURE.md §7).

    planning         a session's plan: cache lookup, parse, request, auto rule, layout, stepping aside
    live_tuning      fusion="auto" tuned on live traffic, then an atomic swap of the C session
    plan_cache       fused plans saved per model, request and environment
    op_registration  ortfuse's custom ops registered on SessionOptions, once per options
    reference_runs   runs of models holding reference (Python-op) kernels, guarded
    tune_process     a live tuning's measuring in a process of its own
    recorded_feeds   the served feeds a live tuning records
    output_check     a tuned plan's outputs against stock ORT's, before a swap
"""
