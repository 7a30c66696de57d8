"""Which kernel runs a fused op: the registry, lowering to ORT's own ops, and the CPU's ISA levels."""
