"""Which kernel runs a fused op: the registry (native, lowered and reference kernels, as the rules
declare them), the selection for one match, and the kernel ranking measured on this machine (the
CPU's ISA levels: ``ortfuse.foundation.isa``)."""
