"""The kernel-state pool (numba) and reading a live slot.

A slot is ``SLOT_WORDS`` int64 words made in ``CreateKernelV2`` (ORT's ``void* kernel``): the
``const OrtApi*`` ORT passed, the record, the pool, one owned buffer and the attribute values read
with ``KernelInfoGetAttribute_*`` (``words``). ``KernelDestroy`` puts the slot back on the pool's
free list, which grows with ``malloc`` when empty and never shrinks: the number of slots is the peak
number of live kernels (sessions x fused nodes), never a fixed limit. A kernel may keep one malloc'd
buffer in the slot word ``S_OWNED`` (packed weights); ``slot_free`` frees it.

``pool.POOL`` is this process's pool block (every op's record points at it); ``slot_stats`` reads its
counters.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.intrinsics import (
    atomic_cas_i64,
    atomic_xchg_i64,
    c_free,
    c_malloc,
    load_f64,
    load_i64,
    store_i64,
)
from ortfuse.custom_ops.native.pool import POOL, slot_stats  # noqa: F401 - re-exported
from ortfuse.custom_ops.native.words import (
    ATTR_BASE,
    EXT,
    EXT_NAME,
    P_ALLOC_FAIL,
    P_ALLOCATED,
    P_CREATES,
    P_DESTROYS,
    P_FREE,
    P_LIVE,
    P_LOCK,
    P_PEAK,
    S_API,
    S_OWNED,
    S_POOL,
    S_RECORD,
    S_STATE,
    SLOT_BYTES,
    SLOT_LIVE,
    SLOT_WORDS,
)


@njit(cache=True)
def _pool_lock(pool):
    while atomic_cas_i64(pool + 8 * P_LOCK, 0, 1) != 0:
        pass


@njit(cache=True)
def _pool_unlock(pool):
    atomic_xchg_i64(pool + 8 * P_LOCK, 0)


@njit(cache=True)
def slot_alloc(pool):
    """A zeroed slot from the free list (or a new one); 0 if malloc fails."""
    _pool_lock(pool)
    slot = load_i64(pool + 8 * P_FREE)
    if slot != 0:
        store_i64(pool + 8 * P_FREE, load_i64(slot))
    else:
        slot = c_malloc(SLOT_BYTES)
        if slot != 0:
            store_i64(pool + 8 * P_ALLOCATED, load_i64(pool + 8 * P_ALLOCATED) + 1)
        else:
            store_i64(pool + 8 * P_ALLOC_FAIL, load_i64(pool + 8 * P_ALLOC_FAIL) + 1)
    if slot != 0:
        live = load_i64(pool + 8 * P_LIVE) + 1
        store_i64(pool + 8 * P_LIVE, live)
        if live > load_i64(pool + 8 * P_PEAK):
            store_i64(pool + 8 * P_PEAK, live)
        store_i64(pool + 8 * P_CREATES, load_i64(pool + 8 * P_CREATES) + 1)
    _pool_unlock(pool)
    if slot != 0:
        for i in range(SLOT_WORDS):
            store_i64(slot + 8 * i, 0)
        store_i64(slot + 8 * S_STATE, SLOT_LIVE)
        store_i64(slot + 8 * S_POOL, pool)
    return slot


@njit(cache=True)
def slot_free(slot):
    """Return a live slot to its pool's free list (a slot that is not live is left alone)."""
    if slot == 0 or load_i64(slot + 8 * S_STATE) != SLOT_LIVE:
        return
    owned = atomic_xchg_i64(slot + 8 * S_OWNED, 0)
    if owned != 0:
        c_free(owned)
    pool = load_i64(slot + 8 * S_POOL)
    _pool_lock(pool)
    store_i64(slot + 8 * S_STATE, load_i64(pool + 8 * P_FREE))
    store_i64(pool + 8 * P_FREE, slot)
    store_i64(pool + 8 * P_LIVE, load_i64(pool + 8 * P_LIVE) - 1)
    store_i64(pool + 8 * P_DESTROYS, load_i64(pool + 8 * P_DESTROYS) + 1)
    _pool_unlock(pool)


@njit(cache=True)
def slot_api(slot):
    return load_i64(slot + 8 * S_API)


@njit(cache=True)
def slot_name(slot):
    """Address of the op type name (C string) of a live slot."""
    return load_i64(load_i64(slot + 8 * S_RECORD) + EXT + 8 * EXT_NAME)


@njit(cache=True)
def slot_f32(slot, word):
    """The float attribute at attribute word ``word``, as float32."""
    return np.float32(load_f64(slot + 8 * (ATTR_BASE + word)))


@njit(cache=True)
def slot_i64(slot, word):
    return load_i64(slot + 8 * (ATTR_BASE + word))
