"""numba kernels of the fused ops, per pattern (docs/ARCHITECTURE.md §5).

- ``eltwise``: elementwise fused ops (relu, gelu, gelu_tanh, silu, sigmoid, hardswish, hardsigmoid,
  clip, add_relu, broadcast add_relu) and the bias + activation epilogue of GEMM/Conv. Contract and
  API in its docstring. Their float32 transcendental math is ``custom_ops.vecmath`` (§10).
- ``scalar``: the element functions the loops inline, with the reference's NaN, -0 and tie semantics.
- ``amx``: AMX bf16 tiles, bf16 conversion and weight packing for the bf16 GEMM; ``amx_emulated``:
  the same micro-kernel interface on a numba model of the tiles, so the driver is tested on any CPU.
- ``winograd``: the blocks of the Winograd F(4x4,3x3) convolution on NCHWc blocks (input and output
  transforms, the register-blocked product per tile position); ``conv_filters`` (numpy only, no
  numba: planning imports it) transforms filters and holds the float64 references.
- ``depthwise``: the depthwise convolution micro-kernel on NCHWc blocks; ``depthwise_ref`` (numpy
  only) packs its filter and holds the float64 reference.
- ``pointwise``: the 1x1 convolution micro-kernel on NCHWc blocks; ``pointwise_ref`` (numpy only)
  packs its filter.
- ``squeeze_excite`` (numpy only): the squeeze-and-excitation reference and the 1x1 weights read back
  from ORT's blocked filters.

Decisions behind the kernels (measure with ``python tools/kernel_bench.py --dispatcher`` and
``--threshold``):

- numba's default target vectorises loops with 256-bit vectors where LLVM's tuning for the core
  prefers them; ``vecmath.prefer_512bit()`` gives one function 512-bit code. The math-heavy loops
  use it; relu-like loops do not (512-bit was slower there).
- A loop over two arrays is vectorised behind a run-time no-overlap check; called in place it runs
  the scalar fallback. In-place calls take separate one-array loops.
- ``error_model="python"`` (numba's default) puts a zero check before every float division, which
  stops vectorisation: every kernel uses ``error_model="numpy"``.
- numba IR inlining (``inline="always"``) of the math made each kernel compile slower; LLVM's
  ``alwaysinline`` (``vecmath.always_inline()``) gives the same vector code.
- Parallel (prange, OpenMP layer) against serial: with the other core idle prange wins from some
  size on; with the other core busy a woken thread waits for the scheduler tick, at any size. Kernels
  are serial unless the caller passes ``parallel_min`` (default ``eltwise.SERIAL``).
- numba bug (0.68.1): a cached function that calls a ``parallel=True`` function, compiled in a process
  that loaded the callee from the cache, segfaults when itself loaded from the cache (the thread pool
  is never started: calls through a NULL pointer). ``eltwise`` starts the pool at import.

Code that compiles these kernels calls ``custom_ops.numba_setup.configure_numba()`` first (the
package's cache folder, the threading layer); importing this package sets nothing up.
"""
