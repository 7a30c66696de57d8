"""The ORT-facing side of ortfuse: fused op specs, their registration with ORT, and kernels."""
