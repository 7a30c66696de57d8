"""Inputs and outputs of a compute callback (numba): the input count, reading an input (data,
element type, dims), checking it is of the op's float type and rank, allocating an output, and the
one-sentence error statuses ``<OpType>: <text>`` for any mismatch. Nothing reads or writes outside
the tensors ORT gave."""

from __future__ import annotations

import numpy as np
from numba import njit

from ortfuse.custom_ops.abi import ONNX_TYPE_FLOAT, ONNX_TYPE_FLOAT16, ORT_FAIL, ORT_INVALID_ARGUMENT
from ortfuse.custom_ops.intrinsics import load_i32, load_i64, stack_bytes
from ortfuse.custom_ops.native.slots import slot_name
from ortfuse.custom_ops.native.words import EXT, EXT_INPUT_TYPE, MAX_RANK, MSG_CAP, S_RECORD
from ortfuse.custom_ops.ort_api import (
    context_get_input,
    context_get_output,
    context_input_count,
    get_dimensions,
    get_dimensions_count,
    get_tensor_element_type,
    get_tensor_mutable_data,
    get_tensor_type_and_shape,
    release_status,
    release_tensor_type_and_shape_info,
)
from ortfuse.custom_ops.status_messages import cstr, msg_put, msg_put_cstr, msg_put_int, msg_status

_T_COLON = cstr(": ")
_T_INPUT = cstr("input ")
_T_EXPECTS = cstr("expects ")
_T_INPUTS_GOT = cstr(" inputs, got ")
_T_MUST_F32 = cstr(" must be float32, got ONNX element type ")
_T_MUST_F16 = cstr(" must be float16, got ONNX element type ")
_T_RANK = cstr(" has rank ")
_T_RANK_MAX = cstr(", more than the supported ")
_T_MISSING_INPUT = cstr("Missing Input: no tensor given for input ")


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
    st = context_input_count(api, ctx, tmp)
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
    if want != ONNX_TYPE_FLOAT16:
        want = ONNX_TYPE_FLOAT
    if elem == want and rank <= MAX_RANK:
        return 0
    buf = stack_bytes(MSG_CAP)
    n = msg_begin(buf, slot)
    n = msg_put(buf, MSG_CAP, n, _T_INPUT)
    n = msg_put_int(buf, MSG_CAP, n, index)
    if elem != want:
        n = msg_put(buf, MSG_CAP, n, _T_MUST_F16 if want == ONNX_TYPE_FLOAT16 else _T_MUST_F32)
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
