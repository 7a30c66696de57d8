"""The ``OrtApi`` functions used, callable from numba code, and the ``OrtCustomOp`` callback
signatures as numba types.

Each function is an intrinsic ``f(api, args...)`` with ``api`` the ``const OrtApi*`` ORT passed to
CreateKernel (int64): it loads the function from the table (index from ``abi``) and calls it inline,
so the wrappers cost no compilation of their own. Out-parameters are addresses of caller memory
(``intrinsics.stack_bytes``). Functions returning ``OrtStatus*`` return its address (0 = success).
"""

from __future__ import annotations

from numba import njit, types

from ortfuse.custom_ops import abi
from ortfuse.custom_ops.intrinsics import make_call_intrinsic

# --------------------------------------------------------------------------------------------------
# OrtCustomOp callbacks (and ParallelFor's worker) as numba signatures, pointers as int64
# --------------------------------------------------------------------------------------------------

i64 = types.int64
i32 = types.int32
SIG_CREATE_KERNEL = i64(i64, i64, i64)              # void* (const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*)
SIG_GET_STR = i64(i64)                              # const char* (const OrtCustomOp*)
SIG_GET_TYPE = i32(i64, types.uint64)               # ONNXTensorElementDataType (op, size_t index)
SIG_GET_COUNT = types.uint64(i64)                   # size_t (op)
SIG_KERNEL_COMPUTE = types.void(i64, i64)           # void (void* kernel, OrtKernelContext*)
SIG_KERNEL_DESTROY = types.void(i64)                # void (void* kernel)
SIG_GET_CHARACTERISTIC = i32(i64, types.uint64)     # enum (op, size_t index)
SIG_GET_MEM_TYPE = i32(i64, types.uint64)           # OrtMemType (op, size_t index)
SIG_GET_INT = i32(i64)                              # int (op)
SIG_CREATE_KERNEL_V2 = i64(i64, i64, i64, i64)      # OrtStatus* (op, api, info, void** kernel)
SIG_KERNEL_COMPUTE_V2 = i64(i64, i64)               # OrtStatus* (void* kernel, OrtKernelContext*)
SIG_WORKER = types.void(i64, i64)                   # void (void* usr_data, size_t index): ParallelFor's fn

# --------------------------------------------------------------------------------------------------
# OrtApi functions
# --------------------------------------------------------------------------------------------------

create_status = make_call_intrinsic(2, "i64", abi.CREATE_STATUS, "create_status")
"""create_status(api, code, msg_addr) -> OrtStatus*: ORT copies the NUL-terminated message."""
get_error_code = make_call_intrinsic(1, "i32", abi.GET_ERROR_CODE, "get_error_code")
"""get_error_code(api, status) -> OrtErrorCode."""
get_error_message = make_call_intrinsic(1, "i64", abi.GET_ERROR_MESSAGE, "get_error_message")
"""get_error_message(api, status) -> address of the message (owned by the status)."""
_release_status = make_call_intrinsic(1, "void", abi.RELEASE_STATUS, "release_status")
kernel_info_get_float = make_call_intrinsic(3, "i64", abi.KERNEL_INFO_GET_ATTRIBUTE_FLOAT, "kernel_info_get_float")
"""kernel_info_get_float(api, info, name_addr, out_addr): writes a float32 at out_addr."""
kernel_info_get_int64 = make_call_intrinsic(3, "i64", abi.KERNEL_INFO_GET_ATTRIBUTE_INT64, "kernel_info_get_int64")
kernel_info_get_string = make_call_intrinsic(4, "i64", abi.KERNEL_INFO_GET_ATTRIBUTE_STRING,
                                              "kernel_info_get_string")
"""kernel_info_get_string(api, info, name_addr, out_addr, size_addr): *size is the buffer size in,
the length including NUL out; a too-small buffer gives an error status (and the needed size)."""
kernel_info_get_floats = make_call_intrinsic(4, "i64", abi.KERNEL_INFO_GET_ATTRIBUTE_ARRAY_FLOAT,
                                              "kernel_info_get_floats")
"""kernel_info_get_floats(api, info, name_addr, out_addr, size_addr): a FLOATS attribute as float32
values; *size is the capacity in elements in, the count out (too small: error status, needed count)."""
kernel_info_get_ints = make_call_intrinsic(4, "i64", abi.KERNEL_INFO_GET_ATTRIBUTE_ARRAY_INT64, "kernel_info_get_ints")
"""kernel_info_get_ints(api, info, name_addr, out_addr, size_addr): an INTS attribute as int64, like
kernel_info_get_floats."""
context_input_count = make_call_intrinsic(2, "i64", abi.KERNEL_CONTEXT_GET_INPUT_COUNT, "context_input_count")
context_output_count = make_call_intrinsic(2, "i64", abi.KERNEL_CONTEXT_GET_OUTPUT_COUNT, "context_output_count")
context_get_input = make_call_intrinsic(3, "i64", abi.KERNEL_CONTEXT_GET_INPUT, "context_get_input")
"""context_get_input(api, ctx, index, out_addr): writes the const OrtValue* (0 if absent)."""
context_get_output = make_call_intrinsic(5, "i64", abi.KERNEL_CONTEXT_GET_OUTPUT, "context_get_output")
"""context_get_output(api, ctx, index, dims_addr, rank, out_addr): allocates output `index`."""
context_parallel_for = make_call_intrinsic(5, "i64", abi.KERNEL_CONTEXT_PARALLEL_FOR, "context_parallel_for")
"""context_parallel_for(api, ctx, fn_addr, total, num_batch, usr_data): runs fn(usr_data, i) for
i < total on the session's intra-op thread pool and returns when all are done (API 17+)."""
get_tensor_type_and_shape = make_call_intrinsic(2, "i64", abi.GET_TENSOR_TYPE_AND_SHAPE, "get_tensor_type_and_shape")
get_tensor_element_type = make_call_intrinsic(2, "i64", abi.GET_TENSOR_ELEMENT_TYPE, "get_tensor_element_type")
"""get_tensor_element_type(api, info, out_addr): writes a 32-bit ONNXTensorElementDataType."""
get_dimensions_count = make_call_intrinsic(2, "i64", abi.GET_DIMENSIONS_COUNT, "get_dimensions_count")
get_dimensions = make_call_intrinsic(3, "i64", abi.GET_DIMENSIONS, "get_dimensions")
get_tensor_shape_element_count = make_call_intrinsic(2, "i64", abi.GET_TENSOR_SHAPE_ELEMENT_COUNT,
                                                      "get_tensor_shape_element_count")
_release_tensor_type_and_shape_info = make_call_intrinsic(1, "void", abi.RELEASE_TENSOR_TYPE_AND_SHAPE_INFO,
                                                           "release_tensor_type_and_shape_info")
get_tensor_mutable_data = make_call_intrinsic(2, "i64", abi.GET_TENSOR_MUTABLE_DATA, "get_tensor_mutable_data")
get_allocator_with_default_options = make_call_intrinsic(1, "i64", abi.GET_ALLOCATOR_WITH_DEFAULT_OPTIONS,
                                                          "get_allocator_with_default_options")
create_tensor_as_ort_value = make_call_intrinsic(5, "i64", abi.CREATE_TENSOR_AS_ORT_VALUE, "create_tensor_as_ort_value")
"""create_tensor_as_ort_value(api, allocator, dims_addr, rank, elem_type, out_addr): a tensor owned
by the caller (release it with release_value)."""
_release_value = make_call_intrinsic(1, "void", abi.RELEASE_VALUE, "release_value")


@njit(cache=True)
def release_status(api, status):
    if status != 0:
        _release_status(api, status)


@njit(cache=True)
def release_tensor_type_and_shape_info(api, info):
    if info != 0:
        _release_tensor_type_and_shape_info(api, info)


@njit(cache=True)
def release_value(api, value):
    if value != 0:
        _release_value(api, value)
