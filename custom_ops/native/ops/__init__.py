"""The native op families: one module (or subpackage) per family of native ops, found by
``registration.native_op_table()`` with ``pkgutil.iter_modules`` over this package. Nothing lists
them: adding a family is adding a module here (docs/ARCHITECTURE.md §5, §6).

Contract of a family module:

* It exports ``NATIVE_OPS``, a tuple of ``native.op_def.NativeOpDef``: every module or subpackage
  here must (discovery refuses one without it, and an op name declared twice).
* Importing it compiles nothing. Module-level code builds constants and ``NativeOpDef``s; numba
  functions are decorated (``@njit(..., cache=True)``) and compile on first use; computes and
  workers are plain Python functions that ``native.install.ensure_registered`` compiles to cfuncs
  when an op using them is first registered (or loads from numba's on-disk cache).
* It imports only lower levels: the runtime (``ortfuse.custom_ops.native.*``), ``custom_ops.kernels``,
  ``vecmath``, ``reference``/``specs``, and another family for kernels they share (no cycle); never
  ``registration``.
* Op names are the spec's op name (``OpSpec.name``, e.g. ``FusedSiLU``) or a declared variant of it
  (``FusedSiLUF16``), never ending in ``Ref`` (the Python-op path), unique across families.

A new float32 unary elementwise op is one new module here; for example ``mish.py`` for ``FusedMish``
(x * tanh(softplus(x))), after ``silu.py``::

    from numba import njit

    from ortfuse.custom_ops.native.elementwise import compute_unary, map_span, unary_block
    from ortfuse.custom_ops.native.op_def import NativeOpDef
    from ortfuse.custom_ops.vecmath import always_inline, ...   # the element math

    @njit(nogil=True, error_model="numpy", cache=True)
    def mish_f32(v):                                     # one float32 -> float32, inlined
        always_inline()
        return ...

    @njit(nogil=True, error_model="numpy", cache=True)
    def mish_span(x, y, s, e):                           # pieces, cache hints, float16 widening
        map_span(x, y, s, e, mish_f32)

    def _mish_worker(args, block):
        _slot, x, y, s, e = unary_block(args, block)
        mish_span(x, y, s, e)

    NATIVE_OPS = (NativeOpDef("FusedMish", ("X",), compute_unary, _mish_worker),)

``compute_unary`` (shared by every unary op) checks the input count, element type and rank,
allocates the output and runs the worker on blocks; ``native.elementwise`` says what a span must
do. The op is then registrable with ``registration.register_native``; the fusion rule that names
it as its native kernel makes the rewriter use it.
"""
