"""numba kernels of the fused ops, per pattern.

- ``eltwise``: elementwise fused ops (relu, gelu, gelu_tanh, silu, hardswish, hardsigmoid, clip,
  add_relu, broadcast add_relu) and the bias + activation epilogue of GEMM/Conv. Contract and API in
  its docstring. The vectorisable float32 math they use is ``custom_ops.vecmath``.
"""
