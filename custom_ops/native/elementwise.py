"""What the elementwise op families share: blocks and cache hints, array views over ORT buffers, and
the compute of a unary op (one float input into a same-shape output).

A unary op family supplies only a *span* function (``@njit``: the math on elements ``[s, e)`` of
arrays x and y) and a *worker* that runs it on one block::

    def _worker(args, block):
        _slot, x, y, s, e = unary_block(args, block)     # unary_f16_block for float16 tensors
        my_span(x, y, s, e)

declared as ``NativeOpDef(name, ("X",), compute_unary, _worker)`` (``compute_unary`` checks the
input count, element type and rank, allocates the output and hands its blocks to ``run_blocks``).
The span loops over slices that start at index 0 (numba then drops its negative-index wraparound
and LLVM vectorises the loop), uses ``error_model="numpy"`` (no zero-division branch to block
vectorising; x / 0 gives +-Inf/NaN like the reference) and stays serial: the blocks are the
parallelism. A span whose loop divides or computes exp per element runs in pieces with cache hints
ahead (``hint_plan``, ``hint_ahead``): such a loop issues its loads too slowly for the hardware
prefetcher to hide memory latency. Measure a span with ``python tools/kernel_bench.py --cases <case>``.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from ortfuse.custom_ops.intrinsics import int_to_voidptr, load_i64, prefetch_lines, stack_bytes, store_i64
from ortfuse.custom_ops.native.inputs import check_input_count, element_count, make_output, read_float_input
from ortfuse.custom_ops.native.slots import slot_api
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import DIMS_BYTES
from ortfuse.custom_ops.vecmath import always_inline, from_f32, prefer_512bit, to_f32

BLOCK = 1 << 14  # elements per block (the unit of work handed to a thread)
PIECE = 256      # the hinted spans run in pieces this long, each after hinting the lines AHEAD elements on
AHEAD = 1024
HINT_MIN = 1 << 18  # tensors shorter than this (1 MiB of float32) get no hints (hint_plan)


@njit(cache=True)
def f32_view(addr, n):
    """The n float32 values at ``addr`` as an array."""
    return carray(int_to_voidptr(addr), (n,), np.float32)


@njit(nogil=True, cache=True)
def copy_f32(src, dst, n):
    """The n float32 values at address src to address dst, through views indexed from zero (vector
    loads and stores, where an index at a signed offset compiles to gathers and scatters); inlined
    into its callers, which copy a few vectors at a time."""
    always_inline()
    x = f32_view(src, n)
    y = f32_view(dst, n)
    for i in range(n):
        y[i] = x[i]


@njit(cache=True)
def u16_view(addr, n):
    """The n float16 values at ``addr`` as an array of their bits (uint16)."""
    return carray(int_to_voidptr(addr), (n,), np.uint16)


@njit(nogil=True, cache=True)
def hint_plan(n, s, e):
    """(limit, step) of a span [s, e) of an n-element tensor: hints below ``limit`` in pieces of ``step``.
    A tensor shorter than HINT_MIN fits in L2 with its output: there pieces and hints only cost, so
    no hints and one piece."""
    always_inline()
    if n >= HINT_MIN:
        return e, PIECE
    return s, max(e - s, 1)


@njit(nogil=True, cache=True)
def hint_ahead(xa, ya, size, p, q, e):
    """Cache hints for elements [p, q) + AHEAD (below e) of the arrays at xa (read) and ya (write),
    of ``size``-byte elements, before a span's piece [p, q) is computed: they keep main memory busy
    while the piece computes. Inlined, and given addresses: a call per piece, or arrays passed to the
    inlined function, cost more than the hints gain."""
    always_inline()
    lo = p + AHEAD
    hi = min(q + AHEAD, e)
    if lo < hi:
        prefetch_lines(xa + size * lo, size * (hi - lo), False)
        prefetch_lines(ya + size * lo, size * (hi - lo), True)


@njit(nogil=True, error_model="numpy", cache=True)
def map_span(x, y, s, e, elem):
    """y[i] = elem(x[i]) on [s, e) in pieces, each after the cache hints of ``hint_ahead``: x and y of
    float32, or of float16 bits (uint16: widened, computed in float32, rounded to float16 once).
    ``elem`` is a numba function of one float32 (a vecmath-style element function); numba binds it
    when this span is compiled for it, and LLVM inlines it into the loop, which then vectorises. The
span itself is inlined into each op's span function (one compiled loop per op)."""
    always_inline()
    prefer_512bit()
    limit, step = hint_plan(x.shape[0], s, e)
    for p in range(s, e, step):
        q = min(p + step, e)
        hint_ahead(x.ctypes.data, y.ctypes.data, x.itemsize, p, q, limit)
        xs = x[p:q]
        ys = y[p:q]
        for i in range(xs.shape[0]):
            ys[i] = from_f32(elem(to_f32(xs[i])), ys)


# args block of the unary family (int64 words)
UA_SLOT, UA_X, UA_Y, UA_N = range(4)
UNARY_ARGS_BYTES = 8 * 4


def compute_unary(kernel, ctx):
    """Compute of one float input (the op's declared float type) into a same-shape output, in blocks
    of BLOCK elements: a plain function, compiled as the ``KernelComputeV2`` of every unary op."""
    api = slot_api(kernel)
    st = check_input_count(api, ctx, kernel, 1)
    if st != 0:
        return st
    dims = stack_bytes(DIMS_BYTES)
    st, px, rx = read_float_input(api, ctx, kernel, 0, dims)
    if st != 0:
        return st
    st, py = make_output(api, ctx, 0, dims, rx)
    if st != 0:
        return st
    n = element_count(dims, rx)
    if n == 0:
        return 0
    args = stack_bytes(UNARY_ARGS_BYTES)
    store_i64(args + 8 * UA_SLOT, kernel)
    store_i64(args + 8 * UA_X, px)
    store_i64(args + 8 * UA_Y, py)
    store_i64(args + 8 * UA_N, n)
    return run_blocks(api, ctx, kernel, args, (n + BLOCK - 1) // BLOCK, n)


@njit(cache=True)
def unary_block(args, block):
    """(slot, x, y, start, end) of one block of a unary compute, x and y as float32 arrays."""
    n = load_i64(args + 8 * UA_N)
    x = f32_view(load_i64(args + 8 * UA_X), n)
    y = f32_view(load_i64(args + 8 * UA_Y), n)
    s = block * BLOCK
    return load_i64(args + 8 * UA_SLOT), x, y, s, min(n, s + BLOCK)


@njit(cache=True)
def unary_f16_block(args, block):
    """(slot, x, y, start, end) of one block of a unary compute, x and y as float16 bits."""
    n = load_i64(args + 8 * UA_N)
    s = block * BLOCK
    return (load_i64(args + 8 * UA_SLOT), u16_view(load_i64(args + 8 * UA_X), n),
            u16_view(load_i64(args + 8 * UA_Y), n), s, min(n, s + BLOCK))
