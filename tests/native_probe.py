"""The test-only native op ``OrtfuseAbiProbe``: it reports what the ABI sees (every OrtApi function
the runtime uses, attribute reading, error statuses), for tests/test_native_abi.py. Not a fused op:
``add_probe_op()`` adds it to this process's native op table (``registration.add_native_op``)."""

from __future__ import annotations

import numpy as np
from numba import carray

from ortfuse.custom_ops import abi, ort_api
from ortfuse.custom_ops.intrinsics import int_to_voidptr, load_i32, load_i64, load_u8, stack_bytes, store_i64
from ortfuse.custom_ops.native.elementwise import f32_view
from ortfuse.custom_ops.native.inputs import element_count, fail, make_output, read_input
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.slots import slot_api, slot_f32, slot_i64
from ortfuse.custom_ops.native.words import DIMS_BYTES, MAX_RANK
from ortfuse.custom_ops.registration import add_native_op
from ortfuse.custom_ops.status_messages import cstr, msg_put, msg_status

PROBE_OP = "OrtfuseAbiProbe"
PROBE_OUT = 40
PROBE_CHOICES = ("alpha", "beta", "gamma")
PR_F, PR_I, PR_S, PR_FO, PR_IO, PR_MODE = 0, 1, 2, 6, 7, 8   # attribute words (s takes 1 + 3)
_T_PROBE_FAIL = cstr("failure requested by attribute mode=1")
_T_PROBE_MSG = cstr("probe message")


def _compute_probe(kernel, ctx):
    """Output float64[40]: [0] input count, [1] output count, [2] X element type, [3] X rank,
    [4:12] X dims, [12] Y element type, [13] Y rank, [14:22] Y dims, [22] f, [23] i, [24] steps of s,
    [25:28] codes of s, [28] fo, [29] io, [30] error code and [31] message length read back from a
    status made with CreateStatus, [32] its first byte, [33] element count and [34] element type of a
    tensor made with CreateTensorAsOrtValue, [35] sum of X if float32, [36] mode."""
    api = slot_api(kernel)
    if slot_i64(kernel, PR_MODE) == 1:
        return fail(api, kernel, _T_PROBE_FAIL)
    tmp = stack_bytes(64)
    dims = stack_bytes(DIMS_BYTES)
    out_dims = stack_bytes(8)
    store_i64(out_dims, PROBE_OUT)
    st, po = make_output(api, ctx, 0, out_dims, 1)
    if st != 0:
        return st
    o = carray(int_to_voidptr(po), (PROBE_OUT,), np.float64)
    for i in range(PROBE_OUT):
        o[i] = -1.0
    st = ort_api.context_input_count(api, ctx, tmp)
    if st != 0:
        return st
    o[0] = load_i64(tmp)
    st = ort_api.context_output_count(api, ctx, tmp)
    if st != 0:
        return st
    o[1] = load_i64(tmp)
    sum_x = -1.0
    for inp in range(2):
        st, pd, et, rank = read_input(api, ctx, inp, dims)
        if st != 0:
            return st
        base = 2 + 10 * inp
        o[base] = et
        o[base + 1] = rank
        for d in range(min(rank, 8)):
            o[base + 2 + d] = load_i64(dims + 8 * d)
        if inp == 0 and et == abi.ONNX_TYPE_FLOAT and rank <= MAX_RANK:
            cnt = element_count(dims, rank)
            xs = f32_view(pd, cnt)
            sum_x = 0.0
            for i in range(cnt):
                sum_x += xs[i]
    o[22] = slot_f32(kernel, PR_F)
    o[23] = slot_i64(kernel, PR_I)
    steps = slot_i64(kernel, PR_S)
    o[24] = steps
    for s in range(3):
        o[25 + s] = slot_i64(kernel, PR_S + 1 + s) if s < steps else -1
    o[28] = slot_f32(kernel, PR_FO)
    o[29] = slot_i64(kernel, PR_IO)
    # CreateStatus -> GetErrorCode / GetErrorMessage -> ReleaseStatus
    buf = stack_bytes(64)
    n = msg_put(buf, 64, 0, _T_PROBE_MSG)
    status = msg_status(api, abi.ORT_NOT_IMPLEMENTED, buf, n)
    o[30] = ort_api.get_error_code(api, status)
    msg = ort_api.get_error_message(api, status)
    length = 0
    while load_u8(msg + length) != 0 and length < 1000:
        length += 1
    o[31] = length
    o[32] = load_u8(msg)
    ort_api.release_status(api, status)
    # GetAllocatorWithDefaultOptions -> CreateTensorAsOrtValue -> GetTensorMutableData ->
    # GetTensorTypeAndShape -> GetTensorShapeElementCount / GetTensorElementType -> ReleaseValue
    st = ort_api.get_allocator_with_default_options(api, tmp)
    if st != 0:
        return st
    alloc = load_i64(tmp)
    tdims = stack_bytes(24)
    store_i64(tdims, 2)
    store_i64(tdims + 8, 3)
    store_i64(tdims + 16, 4)
    st = ort_api.create_tensor_as_ort_value(api, alloc, tdims, 3, abi.ONNX_TYPE_FLOAT, tmp)
    if st != 0:
        return st
    value = load_i64(tmp)
    st = ort_api.get_tensor_mutable_data(api, value, tmp + 8)
    if st == 0:
        t = f32_view(load_i64(tmp + 8), 24)
        for i in range(24):
            t[i] = i
    if st == 0:
        st = ort_api.get_tensor_type_and_shape(api, value, tmp + 16)
    if st == 0:
        info = load_i64(tmp + 16)
        store_i64(tmp + 24, 0)
        st = ort_api.get_tensor_shape_element_count(api, info, tmp + 24)
        o[33] = load_i64(tmp + 24)
        store_i64(tmp + 32, 0)
        if st == 0:
            st = ort_api.get_tensor_element_type(api, info, tmp + 32)
            o[34] = load_i32(tmp + 32)
        ort_api.release_tensor_type_and_shape_info(api, info)
    ort_api.release_value(api, value)
    if st != 0:
        return st
    o[35] = sum_x
    o[36] = slot_i64(kernel, PR_MODE)
    return 0


PROBE = NativeOpDef(PROBE_OP, ("X", "Y"), _compute_probe,
                    input_type=abi.ONNX_TYPE_UNDEFINED, output_type=abi.ONNX_TYPE_DOUBLE,
                    attrs=(AttrDef("f", "float", PR_F), AttrDef("i", "int", PR_I),
                           AttrDef("s", "choice", PR_S, required=False, choices=PROBE_CHOICES, max_steps=3),
                           AttrDef("fo", "float", PR_FO, required=False, default=2.5),
                           AttrDef("io", "int", PR_IO, required=False, default=-7),
                           AttrDef("mode", "int", PR_MODE, required=False, default=0)))


def add_probe_op() -> None:
    """Make ``OrtfuseAbiProbe`` a native op of this process (``register_native`` then accepts it)."""
    add_native_op(PROBE)
