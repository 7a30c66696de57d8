"""The foundation of ortfuse: what every other package may import, and which imports none of them
(docs/ARCHITECTURE.md §2). Standard library at import time; onnxruntime and llvmlite where a function
needs them.

    cache_paths      where every cache lives, private to this user
    files            private atomic writes, the one lock helper, models as paths or bytes, content digests
    versions         the installed versions that key the caches
    source_digest    digests of ortfuse's own sources, for cache keys
    messages         errors as one sentence
    session_options  the config entries ortfuse defines and reads, the one SessionOptions builder
    protocol         the timing protocol every measurement follows: interleaved runs, repeats, ratios
    yielding         tuning runs and timings that yield to served runs
    isa              the CPU's features and ISA levels, numba's target for each level
    child_process    child processes that start clean, run at idle priority and die with their parent
    plan_store       a plan store replicas share: published plan files by key, a lease per key
"""
