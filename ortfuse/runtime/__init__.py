"""Running a session's plan (docs/ARCHITECTURE.md §7): the orchestration on top of the fusion
pipeline, the layout planner and the tuner, which import nothing of it.

    planning         a session's plan: cache lookup, parse, request, auto rule, layout, stepping aside
    plan_cache       fused plans saved per model, request and environment
    plan_artifact    a tuned plan as one checked file for identical machines (tune --export, plan=)
    shared_plans     replicas sharing a plan store: tuned once under a lease, published, swapped in
    options_copy     the caller's SessionOptions copied, never changed: ortfuse.SessionOptions, registered copies
    live_tuning      fusion="auto" tuned on live traffic: the driver (feeds, thread, gates, checks)
    served_runs      its serving side: served runs counted in flight, the atomic swap of the C session
    stop_points      where the tuning thread may be stopped without leaving a lock held
    tune_process     a live tuning's measuring in a process of its own
    recorded_feeds   the served feeds a live tuning records
"""
