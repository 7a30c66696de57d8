"""Native fused ops: one ``OrtCustomOp`` per op whose callbacks are machine code (numba ``@cfunc``s
and a few LLVM IR stubs), added to onnxruntime-extensions with its exported ``AddExternalCustomOp``
so that they land in domain ``ai.onnx.contrib`` (DESIGN.md §4).

What ORT holds pointers to (all of it lives until the process exits):

* a *record* per op: the ``OrtCustomOp`` struct followed by ``EXT_WORDS`` int64 words that the
  shared callbacks read through the ``const OrtCustomOp*`` ORT passes them (name, counts, types,
  attribute table, pool, worker). The metadata callbacks are LLVM IR stubs (no numba compile),
  ``CreateKernelV2`` and ``KernelDestroy`` are numba cfuncs shared by all ops, and
  ``KernelComputeV2`` is shared by ops of one family (unary, broadcasting binary); what differs per
  op is its *worker*, a ``void(void* args, size_t block)`` cfunc that does the math on one block.
* a *pool* block: spin lock, free list of kernel-state slots, counters and threading settings.
* kernel *slots*: ``SLOT_WORDS`` int64 words made in ``CreateKernelV2`` (ORT's ``void* kernel``):
  the ``const OrtApi*`` ORT passed, the record, and the attributes read with
  ``KernelInfoGetAttribute_*``. ``KernelDestroy`` puts the slot back on the free list, which grows
  with ``malloc`` when empty and never shrinks: the number of slots is the peak number of live
  kernels (sessions x fused nodes), never a fixed limit. A kernel may keep one malloc'd buffer in
  the slot word ``S_OWNED`` (native_amx.py: packed weights); KernelDestroy frees it.

Attribute kinds: ``float`` (stored as float64), ``int`` (int64) and ``choice``: a string attribute
read once in ``CreateKernelV2`` and stored as codes, e.g. ``activation="relu+gelu"`` with choices
``("relu", "gelu", ...)`` becomes ``[2, 0, 1]`` (count, then the index of each ``+``-joined token).
``ints`` / ``floats`` (ONNX INTS / FLOATS, ``KernelInfoGetAttributeArray_*``) are stored the same
way: the count, then each value (int64, or float64 for floats), at most ``max_steps`` of them.
Provenance attributes (``pattern_id``, ``replaced_nodes``) are never read.

Threads (``set_threading``): a compute splits its work into blocks and runs the worker on them
serially below ``parallel_min`` elements, else on ORT's own intra-op pool
(``KernelContext_ParallelFor``, the default: no second pool competing with ORT's spinning threads)
or on numba's OpenMP layer (``prange``). The choice is read at run time, so one cached build
serves all settings.

Use ``ensure_registered(op_names)`` before ``SessionOptions.register_custom_ops_library``;
``registration.register_native`` does both.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import struct
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba import cfunc, njit, prange, types

from ortfuse.custom_ops import abi
from ortfuse.custom_ops.abi import (
    ORT_FAIL,
    ORT_INVALID_ARGUMENT,
    atomic_cas_i64,
    atomic_xchg_i64,
    c_free,
    c_malloc,
    context_get_input,
    context_get_output,
    context_parallel_for,
    cstr,
    get_dimensions,
    get_dimensions_count,
    get_tensor_element_type,
    get_tensor_mutable_data,
    get_tensor_type_and_shape,
    icall2_void,
    icall3_void,
    kernel_info_get_float,
    kernel_info_get_floats,
    kernel_info_get_int64,
    kernel_info_get_ints,
    kernel_info_get_string,
    load_f32,
    load_i32,
    load_i64,
    load_u8,
    msg_put,
    msg_put_cstr,
    msg_put_int,
    msg_status,
    release_status,
    release_tensor_type_and_shape_info,
    stack_bytes,
    store_f64,
    store_i64,
)

log = logging.getLogger("ortfuse.native")

# --------------------------------------------------------------------------------------------------
# Layouts (int64 words)
# --------------------------------------------------------------------------------------------------

EXT = abi.OP_STRUCT_SIZE          # byte offset of the extension words behind the OrtCustomOp
EXT_MAGIC, EXT_NAME, EXT_N_INPUTS, EXT_N_OUTPUTS, EXT_INPUT_TYPE, EXT_OUTPUT_TYPE = 0, 1, 2, 3, 4, 5
EXT_POOL, EXT_N_ATTRS, EXT_ATTRS, EXT_OP_ID, EXT_WORKER = 6, 7, 8, 9, 10
EXT_WORDS = 16
RECORD_MAGIC = 0x4F52544655534531  # "ORTFUSE1"

# attribute descriptor: one per attribute, ATTR_WORDS words each
AD_NAME, AD_KIND, AD_SLOT, AD_REQUIRED, AD_DEFAULT, AD_CHOICES, AD_N_CHOICES, AD_MAX_STEPS = range(8)
ATTR_WORDS = 8
KIND_FLOAT, KIND_INT, KIND_CHOICE, KIND_INTS, KIND_FLOATS = 0, 1, 2, 3, 4
ATTR_KINDS = {"float": KIND_FLOAT, "int": KIND_INT, "choice": KIND_CHOICE, "ints": KIND_INTS, "floats": KIND_FLOATS}

# kernel state slot
SLOT_WORDS = 64
SLOT_BYTES = 8 * SLOT_WORDS
S_STATE, S_API, S_RECORD, S_POOL = 0, 1, 2, 3
S_OWNED = 4                        # a malloc'd buffer the kernel keeps (packed weights); KernelDestroy frees it
ATTR_BASE = 8                      # first word of attribute values
MAX_ATTR_WORDS = SLOT_WORDS - ATTR_BASE
SLOT_LIVE = 0x4B45524E454C4C56     # "KERNELLV": a live slot's state word

# pool block
P_LOCK, P_FREE, P_LIVE, P_ALLOCATED, P_PEAK, P_CREATES, P_DESTROYS, P_ALLOC_FAIL = range(8)
P_PAR_MIN, P_THREADING, P_PAR_FOR = 8, 9, 10   # run-time threading settings (see set_threading)
POOL_WORDS = 16
THREADS_SERIAL, THREADS_ORT, THREADS_NUMBA = 0, 1, 2
THREADING_MODES = {"serial": THREADS_SERIAL, "ort": THREADS_ORT, "numba": THREADS_NUMBA}

MAX_RANK = 12
DIMS_BYTES = 8 * MAX_RANK          # one dims buffer (stack_bytes needs a constant, not an expression)
STRING_ATTR_CAP = 256
MSG_CAP = 512

# --------------------------------------------------------------------------------------------------
# Kernel-state pool (numba)
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Helpers for compute callbacks and workers (numba)
# --------------------------------------------------------------------------------------------------

_T_COLON = cstr(": ")
_T_INPUT = cstr("input ")
_T_EXPECTS = cstr("expects ")
_T_INPUTS_GOT = cstr(" inputs, got ")
_T_MUST_F32 = cstr(" must be float32, got ONNX element type ")
_T_MUST_F16 = cstr(" must be float16, got ONNX element type ")
_T_RANK = cstr(" has rank ")
_T_RANK_MAX = cstr(", more than the supported ")
_T_ATTR = cstr("attribute '")
_T_MISSING = cstr("' is required and missing")
_T_TOO_LONG = cstr("' is longer than 255 bytes")
_T_BAD_CHOICE = cstr("' has unsupported value '")
_T_EXPECTED_ONE_OF = cstr("'; expected '+'-joined tokens from: ")
_T_TOO_MANY = cstr("' has more '+'-joined steps than ")
_T_TOO_MANY_VALUES = cstr("' has more values than ")
_T_NO_MEMORY = cstr("out of memory for kernel state")
_T_COMMA = cstr(", ")
_T_MISSING_INPUT = cstr("Missing Input: no tensor given for input ")


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
    return np.float32(abi.load_f64(slot + 8 * (ATTR_BASE + word)))


@njit(cache=True)
def slot_i64(slot, word):
    return load_i64(slot + 8 * (ATTR_BASE + word))


@njit(cache=True)
def msg_begin(buf, slot):
    """Start a message with ``<OpType>: ``; returns its length."""
    n = msg_put_cstr(buf, MSG_CAP, 0, slot_name(slot))
    return msg_put(buf, MSG_CAP, n, _T_COLON)


@njit(cache=True)
def fail(api, slot, text):
    """An ORT_INVALID_ARGUMENT status ``<OpType>: <text>``."""
    buf = stack_bytes(MSG_CAP)
    n = msg_begin(buf, slot)
    n = msg_put(buf, MSG_CAP, n, text)
    return msg_status(api, ORT_INVALID_ARGUMENT, buf, n)


@njit(cache=True)
def check_input_count(api, ctx, slot, expected):
    """0, or an error status if the node does not have ``expected`` inputs."""
    tmp = stack_bytes(16)
    st = abi.context_input_count(api, ctx, tmp)
    if st != 0:
        return st
    got = load_i64(tmp)
    if got == expected:
        return 0
    buf = stack_bytes(MSG_CAP)
    n = msg_begin(buf, slot)
    n = msg_put(buf, MSG_CAP, n, _T_EXPECTS)
    n = msg_put_int(buf, MSG_CAP, n, expected)
    n = msg_put(buf, MSG_CAP, n, _T_INPUTS_GOT)
    n = msg_put_int(buf, MSG_CAP, n, got)
    return msg_status(api, ORT_INVALID_ARGUMENT, buf, n)


@njit(cache=True)
def read_input(api, ctx, index, dims_addr):
    """Input ``index``: returns (status, data address, element type, rank); its dims (up to
    ``MAX_RANK`` of them) are written at ``dims_addr``. An absent optional input has element type -1."""
    tmp = stack_bytes(32)
    st = context_get_input(api, ctx, index, tmp)
    if st != 0:
        return st, 0, 0, 0
    value = load_i64(tmp)
    if value == 0:
        return 0, 0, -1, 0
    st = get_tensor_type_and_shape(api, value, tmp + 8)
    if st != 0:  # no tensor (an input fed as None): ORT's own kernels fail with "Missing Input" (ORT_FAIL)
        release_status(api, st)
        buf = stack_bytes(MSG_CAP)
        n = msg_put(buf, MSG_CAP, 0, _T_MISSING_INPUT)
        n = msg_put_int(buf, MSG_CAP, n, index)
        return msg_status(api, ORT_FAIL, buf, n), 0, 0, 0
    info = load_i64(tmp + 8)
    elem = 0
    rank = 0
    st = get_tensor_element_type(api, info, tmp + 16)
    if st == 0:
        elem = load_i32(tmp + 16)
        st = get_dimensions_count(api, info, tmp + 24)
    if st == 0:
        rank = load_i64(tmp + 24)
        if rank <= MAX_RANK:
            st = get_dimensions(api, info, dims_addr, rank)
    release_tensor_type_and_shape_info(api, info)
    if st != 0:
        return st, 0, 0, 0
    st = get_tensor_mutable_data(api, value, tmp)
    if st != 0:
        return st, 0, 0, 0
    return 0, load_i64(tmp), elem, rank


@njit(cache=True)
def check_float_input(api, slot, index, elem, rank):
    """0, or an error status if input ``index`` is not of the op's float type (float32, or float16 for
    the float16 ops) or its rank exceeds ``MAX_RANK``."""
    want = load_i64(load_i64(slot + 8 * S_RECORD) + EXT + 8 * EXT_INPUT_TYPE)
    if want != abi.ONNX_TYPE_FLOAT16:
        want = abi.ONNX_TYPE_FLOAT
    if elem == want and rank <= MAX_RANK:
        return 0
    buf = stack_bytes(MSG_CAP)
    n = msg_begin(buf, slot)
    n = msg_put(buf, MSG_CAP, n, _T_INPUT)
    n = msg_put_int(buf, MSG_CAP, n, index)
    if elem != want:
        n = msg_put(buf, MSG_CAP, n, _T_MUST_F16 if want == abi.ONNX_TYPE_FLOAT16 else _T_MUST_F32)
        n = msg_put_int(buf, MSG_CAP, n, elem)
    else:
        n = msg_put(buf, MSG_CAP, n, _T_RANK)
        n = msg_put_int(buf, MSG_CAP, n, rank)
        n = msg_put(buf, MSG_CAP, n, _T_RANK_MAX)
        n = msg_put_int(buf, MSG_CAP, n, MAX_RANK)
    return msg_status(api, ORT_INVALID_ARGUMENT, buf, n)


@njit(cache=True)
def read_float_input(api, ctx, slot, index, dims_addr):
    """``read_input`` then ``check_float_input``: (status, data address, rank) of a float input."""
    st, data, elem, rank = read_input(api, ctx, index, dims_addr)
    if st == 0:
        st = check_float_input(api, slot, index, elem, rank)
    return st, data, rank


@njit(cache=True)
def make_output(api, ctx, index, dims_addr, rank):
    """Allocate output ``index`` with the given dims: returns (status, data address)."""
    tmp = stack_bytes(16)
    st = context_get_output(api, ctx, index, dims_addr, rank, tmp)
    if st != 0:
        return st, 0
    st = get_tensor_mutable_data(api, load_i64(tmp), tmp + 8)
    if st != 0:
        return st, 0
    return 0, load_i64(tmp + 8)


@njit(cache=True)
def element_count(dims_addr, rank):
    n = np.int64(1)
    for i in range(rank):
        n *= load_i64(dims_addr + 8 * i)
    return n


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


# --------------------------------------------------------------------------------------------------
# Shared callbacks: CreateKernelV2 and KernelDestroy (numba), metadata stubs (LLVM IR)
# --------------------------------------------------------------------------------------------------


@njit(cache=True)
def _token_matches(choice, start, end, text):
    """Does the C string at ``choice`` equal bytes [start, end) of the buffer at ``text``?"""
    i = 0
    while True:
        c = load_u8(choice + i)
        if start + i == end:
            return c == 0
        if c == 0 or c != load_u8(text + start + i):
            return False
        i += 1


@njit(cache=True)
def _attr_error(api, op, desc, text, extra_addr, extra_choices):
    buf = stack_bytes(MSG_CAP)
    n = msg_put_cstr(buf, MSG_CAP, 0, load_i64(op + EXT + 8 * EXT_NAME))
    n = msg_put(buf, MSG_CAP, n, _T_COLON)
    n = msg_put(buf, MSG_CAP, n, _T_ATTR)
    n = msg_put_cstr(buf, MSG_CAP, n, load_i64(desc + 8 * AD_NAME))
    n = msg_put(buf, MSG_CAP, n, text)
    if extra_addr != 0:
        n = msg_put_cstr(buf, MSG_CAP, n, extra_addr)
    if extra_choices:
        n = msg_put(buf, MSG_CAP, n, _T_EXPECTED_ONE_OF)
        choices = load_i64(desc + 8 * AD_CHOICES)
        for k in range(load_i64(desc + 8 * AD_N_CHOICES)):
            if k > 0:
                n = msg_put(buf, MSG_CAP, n, _T_COMMA)
            n = msg_put_cstr(buf, MSG_CAP, n, load_i64(choices + 8 * k))
    return msg_status(api, ORT_INVALID_ARGUMENT, buf, n)


@njit(cache=True)
def _read_attrs(op, api, info, slot):
    """Read every described attribute of the node into the slot; returns 0 or an error status."""
    tmp = stack_bytes(16)
    text = stack_bytes(STRING_ATTR_CAP)
    table = load_i64(op + EXT + 8 * EXT_ATTRS)
    for a in range(load_i64(op + EXT + 8 * EXT_N_ATTRS)):
        desc = table + 8 * ATTR_WORDS * a
        name = load_i64(desc + 8 * AD_NAME)
        kind = load_i64(desc + 8 * AD_KIND)
        word = slot + 8 * (ATTR_BASE + load_i64(desc + 8 * AD_SLOT))
        required = load_i64(desc + 8 * AD_REQUIRED) != 0
        store_i64(tmp, 0)
        if kind == KIND_FLOAT:
            st = kernel_info_get_float(api, info, name, tmp)
            if st == 0:
                store_f64(word, np.float64(load_f32(tmp)))
        elif kind == KIND_INT:
            st = kernel_info_get_int64(api, info, name, tmp)
            if st == 0:
                store_i64(word, load_i64(tmp))
        elif kind == KIND_INTS or kind == KIND_FLOATS:
            st = _read_array_attr(api, info, name, kind, load_i64(desc + 8 * AD_MAX_STEPS), word, tmp, text)
            if st != 0 and load_i64(tmp) > load_i64(desc + 8 * AD_MAX_STEPS):
                release_status(api, st)
                buf = stack_bytes(32)
                msg_put_int(buf, 32, 0, load_i64(desc + 8 * AD_MAX_STEPS))
                return _attr_error(api, op, desc, _T_TOO_MANY_VALUES, buf, False)
        else:
            store_i64(tmp, STRING_ATTR_CAP)
            st = kernel_info_get_string(api, info, name, text, tmp)
            if st == 0:
                length = load_i64(tmp) - 1  # ORT reports the size with the NUL
                choices = load_i64(desc + 8 * AD_CHOICES)
                n_choices = load_i64(desc + 8 * AD_N_CHOICES)
                max_steps = load_i64(desc + 8 * AD_MAX_STEPS)
                steps = 0
                start = 0
                while start < length:
                    end = start
                    while end < length and load_u8(text + end) != 43:  # '+'
                        end += 1
                    code = -1
                    for k in range(n_choices):
                        if _token_matches(load_i64(choices + 8 * k), start, end, text):
                            code = k
                            break
                    if code < 0:
                        return _attr_error(api, op, desc, _T_BAD_CHOICE, text, True)
                    if steps >= max_steps:
                        buf = stack_bytes(32)
                        msg_put_int(buf, 32, 0, max_steps)
                        return _attr_error(api, op, desc, _T_TOO_MANY, buf, False)
                    store_i64(word + 8 * (1 + steps), code)
                    steps += 1
                    start = end + 1
                store_i64(word, steps)
            elif load_i64(tmp) > STRING_ATTR_CAP:
                release_status(api, st)
                return _attr_error(api, op, desc, _T_TOO_LONG, 0, False)
        if st != 0:
            release_status(api, st)
            if required:
                return _attr_error(api, op, desc, _T_MISSING, 0, False)
            # optional and absent: the default (float defaults are stored as float64 bits; a
            # missing 'choice', 'ints' or 'floats' is zero values)
            store_i64(word, load_i64(desc + 8 * AD_DEFAULT) if kind == KIND_FLOAT or kind == KIND_INT else 0)
    return 0


@njit(cache=True)
def _read_array_attr(api, info, name, kind, cap, word, size_addr, buf):
    """Read an INTS/FLOATS attribute of at most ``cap`` values into ``word`` (count, then values;
    floats widened to float64) through ``buf`` (STRING_ATTR_CAP bytes); returns 0 or ORT's status,
    with the attribute's true length at ``size_addr`` when it did not fit."""
    store_i64(size_addr, cap)
    if kind == KIND_INTS:
        st = kernel_info_get_ints(api, info, name, buf, size_addr)
    else:
        st = kernel_info_get_floats(api, info, name, buf, size_addr)
    if st != 0:
        return st
    count = min(load_i64(size_addr), cap)  # ORT succeeds only when the values fit; never write past them
    for i in range(count):
        if kind == KIND_INTS:
            store_i64(word + 8 * (1 + i), load_i64(buf + 8 * i))
        else:
            store_f64(word + 8 * (1 + i), np.float64(load_f32(buf + 4 * i)))
    store_i64(word, count)
    return 0


@njit(cache=True)
def _create_kernel(op, api, info):
    """(status, slot): a slot with the API pointer, record and attributes of this node."""
    slot = slot_alloc(load_i64(op + EXT + 8 * EXT_POOL))
    if slot == 0:
        buf = stack_bytes(MSG_CAP)
        n = msg_put_cstr(buf, MSG_CAP, 0, load_i64(op + EXT + 8 * EXT_NAME))
        n = msg_put(buf, MSG_CAP, n, _T_COLON)
        n = msg_put(buf, MSG_CAP, n, _T_NO_MEMORY)
        return msg_status(api, ORT_FAIL, buf, n), 0
    store_i64(slot + 8 * S_API, api)
    store_i64(slot + 8 * S_RECORD, op)
    st = _read_attrs(op, api, info, slot)
    if st != 0:
        slot_free(slot)
        return st, 0
    return 0, slot


def _cb_create_kernel_v2(op, api, info, out):
    st, slot = _create_kernel(op, api, info)
    store_i64(out, slot)
    return st


def _cb_kernel_destroy(kernel):
    slot_free(kernel)


_NUMBA_CALLBACKS = {
    # OrtCustomOp field: (python function, numba signature)
    "CreateKernelV2": (_cb_create_kernel_v2, abi.SIG_CREATE_KERNEL_V2),
    "KernelDestroy": (_cb_kernel_destroy, abi.SIG_KERNEL_DESTROY),
}

# Metadata callbacks: trivial functions of the record, emitted as LLVM IR and JIT-compiled by numba's
# code generator in a few milliseconds (a numba cfunc each would cost ~0.3 s cold).
#   field: (symbol, return type, number of int64 arguments, body)
#   body: ("ext", word) returns that extension word, ("const", value) returns a constant.
_IR_CALLBACKS = {
    "CreateKernel": ("ortfuse_create_kernel_v1", "i64", 3, ("const", 0)),  # unused: V2 is set
    "GetName": ("ortfuse_get_name", "i64", 1, ("ext", EXT_NAME)),
    "GetExecutionProviderType": ("ortfuse_get_ep", "i64", 1, ("const", 0)),  # NULL: CPU
    "GetInputType": ("ortfuse_get_input_type", "i32", 2, ("ext", EXT_INPUT_TYPE)),
    "GetInputTypeCount": ("ortfuse_get_input_count", "i64", 1, ("ext", EXT_N_INPUTS)),
    "GetOutputType": ("ortfuse_get_output_type", "i32", 2, ("ext", EXT_OUTPUT_TYPE)),
    "GetOutputTypeCount": ("ortfuse_get_output_count", "i64", 1, ("ext", EXT_N_OUTPUTS)),
    "KernelCompute": ("ortfuse_kernel_compute_v1", "void", 2, None),     # unused: V2 is set
    "GetInputCharacteristic": ("ortfuse_characteristic", "i32", 2, ("const", abi.INPUT_OUTPUT_REQUIRED)),
    "GetOutputCharacteristic": ("ortfuse_characteristic", "i32", 2, ("const", abi.INPUT_OUTPUT_REQUIRED)),
    "GetInputMemoryType": ("ortfuse_mem_type", "i32", 2, ("const", abi.ORT_MEM_TYPE_DEFAULT)),
    "GetVariadicInputMinArity": ("ortfuse_variadic_min_arity", "i32", 1, ("const", 1)),
    "GetVariadicInputHomogeneity": ("ortfuse_variadic_homogeneity", "i32", 1, ("const", 1)),
    "GetVariadicOutputMinArity": ("ortfuse_variadic_min_arity", "i32", 1, ("const", 1)),
    "GetVariadicOutputHomogeneity": ("ortfuse_variadic_homogeneity", "i32", 1, ("const", 1)),
}


def _build_ir_callbacks():
    """JIT the metadata stubs; returns (library, {field: address})."""
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    i64 = ir.IntType(64)
    rets = {"i64": i64, "i32": ir.IntType(32), "void": ir.VoidType()}
    codegen = cpu_target.target_context.codegen()
    mod = codegen._create_empty_module("ortfuse_meta")
    made = {}
    for symbol, ret, nargs, body in _IR_CALLBACKS.values():
        if symbol in made:
            continue
        fn = ir.Function(mod, ir.FunctionType(rets[ret], [i64] * nargs), symbol)
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        if body is None:
            builder.ret_void()
        elif body[0] == "const":
            builder.ret(ir.Constant(rets[ret], body[1]))
        else:
            addr = builder.add(fn.args[0], ir.Constant(i64, EXT + 8 * body[1]))
            value = builder.load(builder.inttoptr(addr, i64.as_pointer()))
            builder.ret(value if ret == "i64" else builder.trunc(value, rets[ret]))
        made[symbol] = fn
    with global_compiler_lock:
        library = codegen.create_library("ortfuse_meta")
        library.add_ir_module(mod)
        library.finalize()
    return library, {field: library.get_pointer_to_function(spec[0]) for field, spec in _IR_CALLBACKS.items()}


# --------------------------------------------------------------------------------------------------
# Python side: op definitions, records, registration
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttrDef:
    """An attribute read in CreateKernel into attribute word ``slot`` of the kernel state.

    kind: "float" | "int" | "choice" (a string of '+'-joined tokens from ``choices``; it takes
    ``1 + max_steps`` words: the count, then each token's index) | "ints" | "floats" (up to
    ``max_steps`` values, stored like a choice: count, then values). A missing optional attribute
    takes ``default`` (a missing ``choice``, ``ints`` or ``floats`` gives zero values)."""

    name: str
    kind: str
    slot: int
    required: bool = True
    default: float = 0
    choices: tuple[str, ...] = ()
    max_steps: int = 1

    def words(self) -> int:
        return 1 + self.max_steps if self.kind in ("choice", "ints", "floats") else 1


@dataclass(frozen=True)
class NativeOpDef:
    """A native op.

    ``compute`` is a plain function ``(kernel, ctx) -> OrtStatus*`` (int64 addresses) compiled with
    ``cfunc(abi.SIG_KERNEL_COMPUTE_V2, cache=True)``; ops of one family share it (compiled once).
    ``worker`` is a plain function ``(args, block) -> None`` compiled with ``abi.SIG_WORKER``: the
    math of one block, found by ``run_blocks`` through the record. Both compile on first registration.
    """

    name: str
    inputs: tuple[str, ...]
    compute: Callable
    worker: Callable | None = None
    attrs: tuple[AttrDef, ...] = ()
    n_outputs: int = 1
    input_type: int = abi.ONNX_TYPE_FLOAT      # ONNX_TYPE_UNDEFINED: any type (the kernel checks)
    output_type: int = abi.ONNX_TYPE_FLOAT
    node_attrs: Callable | None = None
    """``node_attrs(spec_attrs) -> dict``: the attributes this kernel reads, made by the rewriter from
    the match's spec attributes when it picks this kernel (ValueError: this kernel cannot run it)."""

    def __post_init__(self):
        used = set()
        for a in self.attrs:
            if a.kind not in ATTR_KINDS:
                raise ValueError(f"{self.name}: attribute {a.name!r} has unknown kind {a.kind!r}")
            if a.kind in ("ints", "floats") and 8 * a.max_steps > STRING_ATTR_CAP:
                raise ValueError(f"{self.name}: attribute {a.name!r} may hold at most {STRING_ATTR_CAP // 8} values")
            words = set(range(a.slot, a.slot + a.words()))
            if words & used or a.slot < 0 or a.slot + a.words() > MAX_ATTR_WORDS:
                raise ValueError(f"{self.name}: attribute {a.name!r} overlaps another or leaves the slot")
            used |= words
        if self.name.endswith("Ref"):
            raise ValueError(f"{self.name}: names ending in 'Ref' belong to the Python-op path")


class _Record(ctypes.Structure):
    _fields_ = [("op", abi.OrtCustomOp), ("ext", ctypes.c_int64 * EXT_WORDS)]


class _Registered:
    """Everything ORT or extensions may point at for one op; kept for the process lifetime."""

    def __init__(self, op_def: NativeOpDef, op_id: int, pool_addr: int, callbacks: dict, compute, worker):
        self.op_def = op_def
        self.compute = compute
        self.worker = worker
        self.name = ctypes.create_string_buffer(op_def.name.encode())
        self.attr_names = [ctypes.create_string_buffer(a.name.encode()) for a in op_def.attrs]
        self.choice_strings = []
        self.choice_tables = []
        self.attr_table = (ctypes.c_int64 * max(1, ATTR_WORDS * len(op_def.attrs)))()
        for i, a in enumerate(op_def.attrs):
            table = None
            if a.kind == "choice":
                strings = [ctypes.create_string_buffer(c.encode()) for c in a.choices]
                table = (ctypes.c_int64 * max(1, len(strings)))(*[ctypes.addressof(s) for s in strings])
                self.choice_strings.append(strings)
                self.choice_tables.append(table)
            default = (struct.unpack("<q", struct.pack("<d", float(a.default)))[0] if a.kind == "float"
                       else int(a.default) if a.kind == "int" else 0)
            values = {AD_NAME: ctypes.addressof(self.attr_names[i]),
                      AD_KIND: ATTR_KINDS[a.kind],
                      AD_SLOT: a.slot, AD_REQUIRED: int(a.required), AD_DEFAULT: default,
                      AD_CHOICES: ctypes.addressof(table) if table is not None else 0,
                      AD_N_CHOICES: len(a.choices), AD_MAX_STEPS: a.max_steps}
            for k, v in values.items():
                self.attr_table[ATTR_WORDS * i + k] = v
        rec = _Record()
        rec.op.version = abi.OP_STRUCT_VERSION
        for field, addr in callbacks.items():
            setattr(rec.op, field, addr)
        rec.op.KernelComputeV2 = compute.address
        ext = {EXT_MAGIC: RECORD_MAGIC, EXT_NAME: ctypes.addressof(self.name),
               EXT_N_INPUTS: len(op_def.inputs), EXT_N_OUTPUTS: op_def.n_outputs,
               EXT_INPUT_TYPE: op_def.input_type, EXT_OUTPUT_TYPE: op_def.output_type,
               EXT_POOL: pool_addr, EXT_N_ATTRS: len(op_def.attrs),
               EXT_ATTRS: ctypes.addressof(self.attr_table), EXT_OP_ID: op_id,
               EXT_WORKER: worker.address if worker is not None else 0}
        for k, v in ext.items():
            rec.ext[k] = v
        self.record = rec

    @property
    def address(self) -> int:
        return ctypes.addressof(self.record)


def _immortal(obj):
    """Keep ``obj`` alive through interpreter shutdown, when module globals are cleared but ORT may
    still destroy sessions and so call KernelDestroy on our records, pool and code."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    return obj


_lock = threading.RLock()
_pool = _immortal((ctypes.c_int64 * POOL_WORDS)())  # spin lock, free list, counters, settings
_callbacks: dict | None = None                       # OrtCustomOp field -> address (shared by all ops)
_keep: list = _immortal([])                          # compiled objects ORT points into
_registered: dict[str, _Registered] = _immortal({})
_compiled: dict = _immortal({})                      # python function -> cfunc
_add_external = None
_numba_par_for_cfunc = None
DEFAULT_PARALLEL_MIN = 1 << 16


def _platform_reason() -> str | None:
    if sys.maxsize <= 2**32 or sys.byteorder != "little":
        return "native ops need a 64-bit little-endian process"
    if platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"):
        return f"native ops are untested on {platform.machine()!r} (x86_64 and aarch64 only)"
    return None


def runtime_api_version() -> int | None:
    """The OrtApi version of the installed ORT (its minor version for 1.x), or None if unknown."""
    import onnxruntime

    try:
        major, minor = (int(p) for p in onnxruntime.__version__.split(".")[:2])
    except ValueError:
        return None
    return minor if major == 1 else None


def _load_add_external():
    from ortfuse.custom_ops.registration import library_path

    lib = ctypes.CDLL(library_path())  # the handle ORT will dlopen too: the same op list
    fn = getattr(lib, "AddExternalCustomOp", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = ctypes.c_bool
    return fn


def unavailable_reason() -> str | None:
    """Why the native path cannot be used in this process, or None when it can."""
    from ortfuse.custom_ops.registration import native_disabled_by_env

    if native_disabled_by_env():
        return "disabled by ORTFUSE_NATIVE"
    reason = _platform_reason()
    if reason:
        return reason
    version = runtime_api_version()
    if version is None:
        return "the onnxruntime API version is unknown"
    if version < abi.MIN_RUNTIME_API_VERSION:
        return f"onnxruntime API {version} is older than the {abi.MIN_RUNTIME_API_VERSION} native ops need"
    global _add_external
    with _lock:
        if _add_external is None:
            try:
                _add_external = _load_add_external() or False
            except (OSError, ImportError) as exc:
                return f"cannot load onnxruntime-extensions: {exc}"
        if _add_external is False:
            return "onnxruntime-extensions does not export AddExternalCustomOp"
    return None


def _python_op_names() -> set[str]:
    """Op types defined as onnxruntime-extensions Python ops (``onnx_op``) in this process (none
    when its Python package was never imported: that is where they are defined)."""
    ocos = sys.modules.get("onnxruntime_extensions._ocos")
    Opdef = getattr(ocos, "Opdef", None)  # noqa: N806 - the extensions class
    if Opdef is None:
        return set()
    return {getattr(op, "op_type", "") for op in list(getattr(Opdef, "_odlist", {}).values())}


def native_ops() -> dict[str, NativeOpDef]:
    """Every op type with a native kernel (name -> definition)."""
    from ortfuse.custom_ops.native_ops import NATIVE_OPS

    return NATIVE_OPS


def _numba_threads_ok() -> bool:
    """Is numba's threading layer one that survives calls from many threads (omp or tbb)?"""
    import numba
    from numba.np.ufunc import parallel

    if parallel._is_initialized:
        try:
            return numba.threading_layer() in ("omp", "tbb")
        except ValueError:
            return False
    return str(numba.config.THREADING_LAYER) in ("omp", "tbb", "threadsafe", "safe")


def set_threading(mode: str | None = None, parallel_min: int | None = None) -> tuple[str, int]:
    """Choose how kernels use threads; takes effect on the next run of any session.

    mode: "ort" (blocks on ORT's intra-op pool via KernelContext_ParallelFor; the default),
    "numba" (numba's parallel layer, OpenMP preferred; refused for layers that abort on concurrent
    use) or "serial". parallel_min: element count from which a kernel splits work (negative: never).
    None keeps the current value (initially $ORTFUSE_THREADING and $ORTFUSE_PARALLEL_MIN, else
    "ort" and DEFAULT_PARALLEL_MIN). Returns the (mode, parallel_min) in force.
    """
    global _numba_par_for_cfunc
    with _lock:
        if mode is not None:
            if mode not in THREADING_MODES:
                raise ValueError(f"threading mode must be one of {sorted(THREADING_MODES)}, got {mode!r}")
            if mode == "numba":
                if not _numba_threads_ok():
                    raise RuntimeError("numba's threading layer is not omp or tbb; it may abort when "
                                       "called from several threads")
                if _numba_par_for_cfunc is None:
                    _launch_numba_threads()
                    _numba_par_for_cfunc = cfunc(types.void(types.int64, types.int64, types.int64),
                                                 cache=True)(_cb_numba_par_for)
                    _pool[P_PAR_FOR] = _numba_par_for_cfunc.address
            _pool[P_THREADING] = THREADING_MODES[mode]
        if parallel_min is not None:
            _pool[P_PAR_MIN] = int(parallel_min)
        names = {v: k for k, v in THREADING_MODES.items()}
        return names[int(_pool[P_THREADING])], int(_pool[P_PAR_MIN])


def threading_settings() -> tuple[str, int]:
    return set_threading()


def _launch_numba_threads() -> None:
    """Start numba's threading layer before a parallel kernel is compiled or loaded from the cache:
    cached parallel code links against the layer's scheduler symbols, which exist only once the
    layer is up (else LLVM aborts the process with 'Symbol not found: allocate_sched')."""
    from numba.np.ufunc import parallel

    parallel._launch_threads()


def _compile(fn, sig):
    compiled = _compiled.get(fn)
    if compiled is None:
        compiled = cfunc(sig, cache=True)(fn)
        _compiled[fn] = compiled
    return compiled


def _shared_callbacks() -> dict:
    global _callbacks
    if _callbacks is None:
        library, addresses = _build_ir_callbacks()
        _keep.append(library)
        for field, (fn, sig) in _NUMBA_CALLBACKS.items():
            compiled = _compile(fn, sig)
            addresses[field] = compiled.address
        _callbacks = addresses
    return _callbacks


def _init_settings() -> None:
    env_mode = os.environ.get("ORTFUSE_THREADING", "ort").strip().lower() or "ort"
    env_min = os.environ.get("ORTFUSE_PARALLEL_MIN", "").strip()
    try:
        set_threading(env_mode, int(env_min) if env_min else DEFAULT_PARALLEL_MIN)
    except (ValueError, RuntimeError) as exc:
        log.warning("ortfuse: %s; using ORT's thread pool", exc)
        set_threading("ort", DEFAULT_PARALLEL_MIN)


def ensure_registered(op_names: Iterable[str]) -> tuple[bool, str]:
    """Compile (or load from the cache) and add the native ops ``op_names`` to
    onnxruntime-extensions, once per process.

    Returns (True, "") or (False, reason); on False nothing new was added. Must run before
    ``SessionOptions.register_custom_ops_library`` for the ops to exist in that session.
    """
    names = list(dict.fromkeys(op_names))
    reason = unavailable_reason()
    if reason:
        return False, reason
    defs = native_ops()
    missing = [n for n in names if n not in defs]
    if missing:
        return False, f"no native kernel for {', '.join(missing)}"
    with _lock:
        todo = [n for n in names if n not in _registered]
        if not todo:
            return True, ""
        clash = sorted(set(todo) & _python_op_names())
        if clash:  # the same name on both paths makes extensions' RegisterCustomOps loop forever
            return False, f"a Python op is already named {', '.join(clash)}"
        try:
            if not _registered:
                _init_settings()
            callbacks = _shared_callbacks()
            built = {n: (_compile(defs[n].compute, abi.SIG_KERNEL_COMPUTE_V2),
                         _compile(defs[n].worker, abi.SIG_WORKER) if defs[n].worker else None) for n in todo}
        except Exception as exc:  # noqa: BLE001 - numba/LLVM failure: the caller falls back to the reference path
            log.warning("ortfuse: compiling native kernels failed: %s", exc)
            return False, f"compiling native kernels failed: {type(exc).__name__}: {exc}"
        for n in todo:
            compute, worker = built[n]
            reg = _Registered(defs[n], len(_registered) + 1, ctypes.addressof(_pool), callbacks, compute, worker)
            if not _add_external(reg.address):
                return False, f"AddExternalCustomOp refused {n}"
            _registered[n] = reg
    return True, ""


def registered_ops() -> list[str]:
    """Native op types added to onnxruntime-extensions in this process."""
    with _lock:
        return list(_registered)


def slot_stats() -> dict[str, int]:
    """Kernel-state pool counters: live slots, slots ever allocated (= peak live), creates, destroys."""
    return {"live": int(_pool[P_LIVE]), "allocated": int(_pool[P_ALLOCATED]), "peak": int(_pool[P_PEAK]),
            "creates": int(_pool[P_CREATES]), "destroys": int(_pool[P_DESTROYS]),
            "alloc_failures": int(_pool[P_ALLOC_FAIL])}
