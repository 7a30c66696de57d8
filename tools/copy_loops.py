"""The copy loops ``kernel_bench.py`` rates the fused kernels against: plain stores (serial and
prange, STREAM's Copy as compilers build it) and non-temporal stores (no read-for-ownership of the
output lines), in numba; and a STREAM-like copy bandwidth of each."""

from __future__ import annotations

import statistics
import time

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

F32 = np.float32
NT_COPY_BLOCK = 1 << 16  # elements per prange block of the non-temporal copy


_PLUS_ZERO = F32(0.0)


@numba.njit(nogil=True, parallel=True)
def _par_copy(src, dst):
    """dst = src + 0 with plain stores, on numba's threads (see ``_copy``)."""
    for i in numba.prange(src.size):
        dst[i] = src[i] + _PLUS_ZERO


@numba.njit(nogil=True)
def _copy(src, dst):
    """dst = src + 0: a copy loop with plain stores (STREAM's Copy as a compiler builds it), the
    + 0 (one vaddps per vector, -0 -> +0) so that LLVM does not turn the loop into a call to memcpy,
    which streams (non-temporal stores) above a size threshold and would then time another kind of
    copy (tests/test_kernel_bench.py checks that neither loop calls memcpy)."""
    for i in range(src.size):
        dst[i] = src[i] + _PLUS_ZERO


def copy_bandwidth(n: int, reps: int = 15) -> dict:
    """STREAM-like copy: GB/s = 2 * 4 * n bytes / time (median of reps) of a serial numba loop, a
    prange one and numpy's copyto; ``best`` is the highest."""
    src = np.random.default_rng(1).standard_normal(n).astype(F32)
    dst = np.empty_like(src)
    _par_copy(src, dst)
    _copy(src, dst)
    res = {}
    for name, fn in (("numba", lambda: _copy(src, dst)), ("numba_prange", lambda: _par_copy(src, dst)),
                     ("numpy", lambda: np.copyto(dst, src))):
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            fn()
            ts.append((time.perf_counter_ns() - t0) / 1e9)
        res[name] = 8 * n / statistics.median(ts) / 1e9
    res["best"] = max(res.values())
    return res


@intrinsic
def _stream16(typingctx, src, i, dst, j):
    """dst[j:j+16] = src[i:i+16] as one 64-byte ``!nontemporal`` store (MOVNTPS: no read-for-ownership,
    not kept in the caches); &dst[j] must be 64-byte aligned."""
    if not (isinstance(src, types.Array) and isinstance(dst, types.Array)):
        return None

    def codegen(context, builder, sig, args):
        vec = ir.VectorType(ir.FloatType(), 16).as_pointer()
        s = context.make_array(sig.args[0])(context, builder, value=args[0]).data
        d = context.make_array(sig.args[2])(context, builder, value=args[2]).data
        v = builder.load(builder.bitcast(builder.gep(s, [args[1]]), vec), align=4)
        st = builder.store(v, builder.bitcast(builder.gep(d, [args[3]]), vec), align=64)
        st.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()
    return types.none(src, i, dst, j), codegen


@intrinsic
def _fence(typingctx):
    """A seq_cst fence (MFENCE): the non-temporal stores before it are visible before what follows."""
    def codegen(context, builder, sig, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.none(), codegen


@numba.njit(nogil=True)
def _nt_copy_span(src, dst, dst_addr, s, c):
    """dst[s:s+c] = src[s:s+c] (dst_addr = address of dst[0]): non-temporal stores for the whole
    64-byte lines of dst, plain stores before and after them."""
    k = min(c, ((-(dst_addr + 4 * s)) & 63) >> 2)
    for h in range(s, s + k):
        dst[h] = src[h]
    while k + 16 <= c:
        _stream16(src, s + k, dst, s + k)
        k += 16
    for t in range(s + k, s + c):
        dst[t] = src[t]
    _fence()


@numba.njit(nogil=True)
def _nt_copy(src, dst, dst_addr):
    _nt_copy_span(src, dst, dst_addr, 0, src.size)


@numba.njit(nogil=True, parallel=True)
def _par_nt_copy(src, dst, dst_addr):
    nblocks = (src.size + NT_COPY_BLOCK - 1) // NT_COPY_BLOCK
    for b in numba.prange(nblocks):
        s = b * NT_COPY_BLOCK
        _nt_copy_span(src, dst, dst_addr, s, min(NT_COPY_BLOCK, src.size - s))
