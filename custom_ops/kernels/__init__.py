"""numba kernels of the fused ops, per pattern.

- ``eltwise``: elementwise fused ops (relu, gelu, gelu_tanh, silu, sigmoid, hardswish, hardsigmoid,
  clip, add_relu, broadcast add_relu) and the bias + activation epilogue of GEMM/Conv. Contract and
  API in its docstring. Their float32 transcendental math is ``custom_ops.vecmath``.

Measured facts behind the kernels (numba 0.68.1 / llvmlite 0.50, the 2-core AVX-512 machine):

- numba's default target here (``rocketlake`` + host features) vectorises loops with ymm, not zmm:
  LLVM's tuning for these cores prefers 256-bit vectors. ``vecmath.prefer_512bit()`` gives one
  function zmm code; the math-heavy loops use it (gelu 64K floats in cache: 62 -> 43 us), relu-like
  loops do not (zmm was 1.1-1.25x slower there).
- A loop over two arrays is vectorised behind a run-time no-overlap check; called in place it runs
  the scalar fallback (gelu 8x slower). In-place calls take separate one-array loops.
- ``error_model="python"`` (numba's default) puts a zero check before every float division, which
  stops vectorisation: every kernel uses ``error_model="numpy"``.
- numba IR inlining (``inline="always"``) of the math made each kernel compile ~1 s slower; LLVM's
  ``alwaysinline`` (``vecmath.always_inline()``) gives the same vector code.
- Parallel (prange, OpenMP layer) vs serial, single calls interleaved: with the other core idle,
  prange is 0.35x (relu, 256K) to 0.55x (gelu, 64K-512K) the serial time; with the other core busy,
  every prange call takes 8 or 12 ms (a woken thread waits for the 4 ms scheduler tick), at any size.
  Kernels are serial unless the caller passes ``parallel_min`` (default ``eltwise.SERIAL``).
- numba bug (0.68.1): a cached function that calls a ``parallel=True`` function, compiled in a process
  that loaded the callee from the cache, segfaults when itself loaded from the cache (the thread pool
  is never started: calls through a NULL pointer). ``eltwise`` starts the pool at import.
"""

# Install the package's numba cache locator (user cache folder, stamped from the package sources)
# before any kernel here is compiled, so no cache lands beside the sources (read-only site-packages).
from ortfuse.custom_ops import abi as _abi  # noqa: E402,F401
