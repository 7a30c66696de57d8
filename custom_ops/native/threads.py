"""How a compute runs its blocks: ``run_blocks`` (numba) runs the op's worker on every block, serially
below ``parallel_min`` elements, else on ORT's own intra-op pool (``KernelContext_ParallelFor``, the
default: no second pool competing with ORT's spinning threads) or on numba's OpenMP layer
(``prange``). The choice (``pool.set_threading``) is kept in the pool block and read at run time, so
one build serves all settings (docs/ARCHITECTURE.md §6)."""

from __future__ import annotations

import threading

from numba import cfunc, njit, prange, types

from ortfuse.custom_ops.intrinsics import icall2_void, icall3_void, load_i64
from ortfuse.custom_ops.native import pool
from ortfuse.custom_ops.native.pool import DEFAULT_PARALLEL_MIN, POOL, threading_settings  # noqa: F401 - re-exported
from ortfuse.custom_ops.native.words import (
    EXT,
    EXT_WORKER,
    P_PAR_FOR,
    P_PAR_MIN,
    P_THREADING,
    S_POOL,
    S_RECORD,
    THREADS_NUMBA,
    THREADS_ORT,
)
from ortfuse.custom_ops.numba_setup import configure_numba
from ortfuse.custom_ops.ort_api import context_parallel_for

_lock = threading.RLock()
_numba_par_for_cfunc = None


@njit(cache=True)
def run_blocks(api, ctx, slot, args, nblocks, work):
    """Run the op's worker ``worker(args, b)`` for every block b < nblocks; returns a status.

    ``work`` (elements, or a cost estimate) below the pool's ``parallel_min`` runs serially here;
    above it the blocks go to ORT's intra-op pool or numba's threads, as ``set_threading`` chose.
    """
    worker = load_i64(load_i64(slot + 8 * S_RECORD) + EXT + 8 * EXT_WORKER)
    pool = load_i64(slot + 8 * S_POOL)
    par_min = load_i64(pool + 8 * P_PAR_MIN)
    mode = load_i64(pool + 8 * P_THREADING)
    if nblocks > 1 and par_min >= 0 and work >= par_min:
        if mode == THREADS_ORT:
            return context_parallel_for(api, ctx, worker, nblocks, 0, args)
        if mode == THREADS_NUMBA:
            par_for = load_i64(pool + 8 * P_PAR_FOR)
            if par_for != 0:
                icall3_void(par_for, worker, args, nblocks)
                return 0
    for b in range(nblocks):
        icall2_void(worker, args, b)
    return 0


@njit(parallel=True, cache=True)
def _numba_par_for(worker, args, nblocks):
    for b in prange(nblocks):
        icall2_void(worker, args, b)


def _cb_numba_par_for(worker, args, nblocks):
    _numba_par_for(worker, args, nblocks)


def numba_threads_ok() -> bool:
    """Is numba's threading layer (after ``configure_numba``) one that survives calls from many threads
    (omp or tbb)?"""
    import numba
    from numba.np.ufunc import parallel

    configure_numba()
    if parallel._is_initialized:
        try:
            return numba.threading_layer() in ("omp", "tbb")
        except ValueError:
            return False
    return str(numba.config.THREADING_LAYER) in ("omp", "tbb", "threadsafe", "safe")


def numba_par_for_address() -> int:
    """Address of the cfunc that runs a worker's blocks on numba's threads (compiled once); raises
    RuntimeError when numba's threading layer may abort on concurrent use."""
    global _numba_par_for_cfunc
    with _lock:
        if _numba_par_for_cfunc is None:
            if not numba_threads_ok():
                raise RuntimeError("numba's threading layer is not omp or tbb; it may abort when "
                                   "called from several threads")
            _launch_numba_threads()
            _numba_par_for_cfunc = cfunc(types.void(types.int64, types.int64, types.int64),
                                         cache=True)(_cb_numba_par_for)
        return _numba_par_for_cfunc.address


def _launch_numba_threads() -> None:
    """Start numba's threading layer before a parallel kernel is compiled or loaded from the cache:
    cached parallel code links against the layer's scheduler symbols, which exist only once the
    layer is up (else LLVM aborts the process with 'Symbol not found: allocate_sched')."""
    from numba.np.ufunc import parallel

    parallel._launch_threads()


def set_threading(mode: str | None = None, parallel_min: int | None = None) -> tuple[str, int]:
    """``pool.set_threading``, which this sets up first for mode "numba" (compiling the cfunc that
    runs blocks on numba's threads; RuntimeError when numba's layer may abort on concurrent use)."""
    if mode == "numba":
        POOL[P_PAR_FOR] = numba_par_for_address()
    return pool.set_threading(mode, parallel_min)
