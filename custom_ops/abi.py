"""Facts about ONNX Runtime's C ABI for custom ops, restated from its public header: the layout of
``struct OrtCustomOp``, the position of each ``OrtApi`` function used, versions and enums.

Everything here comes from ``include/onnxruntime/core/session/onnxruntime_c_api.h`` (field order of
``OrtCustomOp`` and the position of each function in the ``OrtApi`` table counted at
``ORT_API_VERSION`` 29; both structs are append-only, so the values hold for every runtime at or
above the version that introduced a member; docs/ARCHITECTURE.md §6). Nothing is copied from ORT,
and nothing here needs numba: the numba side is ``intrinsics`` (memory, atomics, indirect calls),
``ort_api`` (the ``OrtApi`` functions and callback signatures) and ``messages`` (error statuses).
The ``const OrtApi*`` itself is only known at run time: ORT passes it to ``CreateKernel``. Never
load ``libonnxruntime.so`` to get one; the Python binding carries its own copy of ORT.
"""

from __future__ import annotations

import ctypes

# --------------------------------------------------------------------------------------------------
# Versions and enums (onnxruntime_c_api.h)
# --------------------------------------------------------------------------------------------------

HEADER_API_VERSION = 29
"""``ORT_API_VERSION`` of the header the layout below was checked against."""

OP_STRUCT_VERSION = 17
"""``OrtCustomOp.version`` we declare. ORT reads ``CreateKernelV2``/``KernelComputeV2`` from 16 on
(``min_ort_version_with_compute_v2_support``) and passes ``GetApi(version)`` to CreateKernel; 17 makes
that table include ``KernelContext_ParallelFor``. At 17 ORT also looks at ``InferOutputShapeFn``,
``GetStartVersion`` and ``GetEndVersion``, each optional (NULL: no shape function, opset 1 and up).
Members gated at 18+ (``GetMayInplace``, ``GetAliasMap``) are never read."""

MIN_RUNTIME_API_VERSION = 17
"""The oldest ORT API (ORT 1.17) that accepts our struct version and offers KernelContext_ParallelFor."""

# ONNXTensorElementDataType
ONNX_TYPE_UNDEFINED = 0
ONNX_TYPE_FLOAT = 1
ONNX_TYPE_UINT8 = 2
ONNX_TYPE_INT8 = 3
ONNX_TYPE_UINT16 = 4
ONNX_TYPE_INT16 = 5
ONNX_TYPE_INT32 = 6
ONNX_TYPE_INT64 = 7
ONNX_TYPE_STRING = 8
ONNX_TYPE_BOOL = 9
ONNX_TYPE_FLOAT16 = 10
ONNX_TYPE_DOUBLE = 11

ELEMENT_TYPE_NAMES = {0: "undefined", 1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16",
                      6: "int32", 7: "int64", 8: "string", 9: "bool", 10: "float16", 11: "float64",
                      12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128", 16: "bfloat16"}

# OrtErrorCode
ORT_OK = 0
ORT_FAIL = 1
ORT_INVALID_ARGUMENT = 2
ORT_NO_SUCHFILE = 3
ORT_NO_MODEL = 4
ORT_ENGINE_ERROR = 5
ORT_RUNTIME_EXCEPTION = 6
ORT_INVALID_PROTOBUF = 7
ORT_MODEL_LOADED = 8
ORT_NOT_IMPLEMENTED = 9
ORT_INVALID_GRAPH = 10
ORT_EP_FAIL = 11

# OrtCustomOpInputOutputCharacteristic
INPUT_OUTPUT_REQUIRED = 0
INPUT_OUTPUT_OPTIONAL = 1
INPUT_OUTPUT_VARIADIC = 2

# OrtMemType
ORT_MEM_TYPE_DEFAULT = 0

# --------------------------------------------------------------------------------------------------
# OrtApi function slots. The table is append-only; each number is the member's position in
# `struct OrtApi` (0-based), counted from the header and checked by tests/test_native_abi.py.
# --------------------------------------------------------------------------------------------------

API_INDEX = {
    "CreateStatus": 0,
    "GetErrorCode": 1,
    "GetErrorMessage": 2,
    "CreateTensorAsOrtValue": 48,
    "GetTensorMutableData": 51,
    "GetTensorElementType": 60,
    "GetDimensionsCount": 61,
    "GetDimensions": 62,
    "GetTensorShapeElementCount": 64,
    "GetTensorTypeAndShape": 65,
    "GetAllocatorWithDefaultOptions": 78,
    "KernelInfoGetAttribute_float": 85,
    "KernelInfoGetAttribute_int64": 86,
    "KernelInfoGetAttribute_string": 87,
    "KernelInfoGetAttributeArray_float": 162,
    "KernelInfoGetAttributeArray_int64": 163,
    "KernelContext_GetInputCount": 88,
    "KernelContext_GetOutputCount": 89,
    "KernelContext_GetInput": 90,
    "KernelContext_GetOutput": 91,
    "KernelContext_ParallelFor": 274,
    "ReleaseStatus": 93,
    "ReleaseValue": 96,
    "ReleaseTensorTypeAndShapeInfo": 99,
}

REGISTRATION_API_INDEX = {
    # used only by the ahead-of-time library's RegisterCustomOps (C), checked end to end by
    # tests/test_aot.py (a plain onnxruntime session registers the library and runs a fused model)
    "CreateCustomOpDomain": 26,
    "CustomOpDomain_Add": 27,
    "AddCustomOpDomain": 28,
}

CREATE_STATUS = 0
GET_ERROR_CODE = 1
GET_ERROR_MESSAGE = 2
CREATE_TENSOR_AS_ORT_VALUE = 48
GET_TENSOR_MUTABLE_DATA = 51
GET_TENSOR_ELEMENT_TYPE = 60
GET_DIMENSIONS_COUNT = 61
GET_DIMENSIONS = 62
GET_TENSOR_SHAPE_ELEMENT_COUNT = 64
GET_TENSOR_TYPE_AND_SHAPE = 65
GET_ALLOCATOR_WITH_DEFAULT_OPTIONS = 78
KERNEL_INFO_GET_ATTRIBUTE_FLOAT = 85
KERNEL_INFO_GET_ATTRIBUTE_INT64 = 86
KERNEL_INFO_GET_ATTRIBUTE_STRING = 87
KERNEL_INFO_GET_ATTRIBUTE_ARRAY_FLOAT = 162
KERNEL_INFO_GET_ATTRIBUTE_ARRAY_INT64 = 163
KERNEL_CONTEXT_GET_INPUT_COUNT = 88
KERNEL_CONTEXT_GET_OUTPUT_COUNT = 89
KERNEL_CONTEXT_GET_INPUT = 90
KERNEL_CONTEXT_GET_OUTPUT = 91
KERNEL_CONTEXT_PARALLEL_FOR = 274
RELEASE_STATUS = 93
RELEASE_VALUE = 96
RELEASE_TENSOR_TYPE_AND_SHAPE_INFO = 99

# --------------------------------------------------------------------------------------------------
# struct OrtCustomOp
# --------------------------------------------------------------------------------------------------

OP_CALLBACK_FIELDS = (
    # name                         since OrtCustomOp.version (as ORT gates it)
    ("CreateKernel", 1),
    ("GetName", 1),
    ("GetExecutionProviderType", 1),
    ("GetInputType", 1),
    ("GetInputTypeCount", 1),
    ("GetOutputType", 1),
    ("GetOutputTypeCount", 1),
    ("KernelCompute", 1),
    ("KernelDestroy", 1),
    ("GetInputCharacteristic", 8),    # read from 8 on; NULL crashes ORT even below (docs/ARCHITECTURE.md §6)
    ("GetOutputCharacteristic", 8),
    ("GetInputMemoryType", 13),       # read when version > 12
    ("GetVariadicInputMinArity", 14),
    ("GetVariadicInputHomogeneity", 14),
    ("GetVariadicOutputMinArity", 14),
    ("GetVariadicOutputHomogeneity", 14),
    ("CreateKernelV2", 16),           # returns OrtStatus*, kernel through an out pointer
    ("KernelComputeV2", 16),          # returns OrtStatus*: errors reach Python as exceptions
    ("InferOutputShapeFn", 17),
    ("GetStartVersion", 17),
    ("GetEndVersion", 17),
    ("GetMayInplace", 18),
    ("ReleaseMayInplace", 18),
    ("GetAliasMap", 20),
    ("ReleaseAliasMap", 20),
)


class OrtCustomOp(ctypes.Structure):
    """``struct OrtCustomOp``: ``uint32_t version`` then one function pointer per callback, in header order.

    Function pointers are stored as addresses (``c_void_p``), filled from ``cfunc.address``.
    """

    _fields_ = [("version", ctypes.c_uint32)] + [(name, ctypes.c_void_p) for name, _ in OP_CALLBACK_FIELDS]


OP_STRUCT_SIZE = ctypes.sizeof(OrtCustomOp)
assert OP_STRUCT_SIZE == 8 + 8 * len(OP_CALLBACK_FIELDS), "unexpected OrtCustomOp padding"
