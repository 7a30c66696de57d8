"""Which kernel runs a fused op, and how ORT gets it (docs/ARCHITECTURE.md §5).

    registry         native, lowered and reference kernels, as the rules declare them
    selection        the kernel for one match
    ranking          the kernel order measured on this machine, per class of match
    op_registration  ortfuse's custom ops registered on SessionOptions, once per options
    reference_runs   runs of models holding reference (Python-op) kernels, guarded

The CPU's ISA levels are ``ortfuse.foundation.isa``.
"""
