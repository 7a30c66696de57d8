"""A small binding to ONNX Runtime's C ABI for custom ops, usable from numba ``@cfunc`` code.

Everything here mirrors ORT's public header ``include/onnxruntime/core/session/onnxruntime_c_api.h``
(field order of ``OrtCustomOp`` and the position of each function in the ``OrtApi`` table were counted
from the header at ``ORT_API_VERSION`` 29; both structs are append-only, so the values hold for every
runtime at or above the version that introduced a member). Nothing is copied from ORT: these are
facts about its ABI, restated.

Pieces:

* ``OrtCustomOp`` -- the ctypes struct ORT reads a custom op from (function pointers as addresses).
* ``API_INDEX`` and one constant per function used -- the slot of each ``OrtApi`` function.
  The ``const OrtApi*`` itself is only known at run time: ORT passes it to ``CreateKernel``. Never
  load ``libonnxruntime.so`` to get one; the Python binding carries its own copy of ORT.
* numba intrinsics: loads and stores at integer addresses, int-to-pointer (for ``numba.carray``),
  stack buffers, ``malloc``/``free``, atomics, and indirect calls of a function address.
* one intrinsic per ``OrtApi`` function used (``create_status(api, code, msg)``...): it loads the
  function from the table and calls it inline, so the wrappers cost no compilation of their own.
* message building helpers (``msg_*``) for error statuses made in numba code.

Pointers are plain ``int64`` values in numba code. The indirect calls pass every argument as a 64-bit
integer register and return a 64-bit integer (or 32-bit for enum results): that is exact for pointers,
``size_t`` and ``int64_t``, and correct for the 32-bit enum arguments used (``OrtErrorCode`` in
``CreateStatus``, ``ONNXTensorElementDataType`` in ``CreateTensorAsOrtValue``) on the 64-bit System V
and AAPCS64 ABIs, where a callee reads only the low 32 bits of an integer register. Floats never
cross these calls by value (ORT writes them through pointers).

Importing this module also sets numba up, before anything here is compiled:

* on-disk cache: functions defined in this package are cached under ``cache_root()``
  (``$NUMBA_CACHE_DIR`` or ``~/.cache/ortfuse/numba``, never beside the sources) and stamped with
  ``package_source_stamp()``, a digest of every file of the package that contains numba code, so
  an edit of a kernel in one file recompiles the cfuncs in other files that call it. Functions
  outside the package keep numba's usual cache locations.
* threading layer: OpenMP (``omp``) when the user chose none, numba's threads have not started and
  OpenMP is importable (DESIGN.md §4b: ``workqueue`` aborts on concurrent use).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.errors import RequireLiteralValue, TypingError
from numba.extending import intrinsic

from ortfuse.custom_ops.vecmath import always_inline

# --------------------------------------------------------------------------------------------------
# numba set-up, done before any function below is decorated (the cache locator is chosen then)
# --------------------------------------------------------------------------------------------------

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def cache_root() -> str:
    """Where compiled kernels of this package are cached: ``$NUMBA_CACHE_DIR`` if set, else
    ``$XDG_CACHE_HOME/ortfuse/numba`` (``~/.cache/ortfuse/numba``). Never beside the sources, which
    may be read-only in site-packages."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.environ["NUMBA_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ortfuse", "numba")


def _package_sources() -> list[str]:
    found = []
    for root, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found.extend(os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))
    return found


@functools.lru_cache(maxsize=8)
def _digest(stats: tuple) -> str:
    h = hashlib.sha256(numba.__version__.encode())
    for path, _mtime, _size in stats:
        with open(path, "rb") as f:
            data = f.read()
        if b"numba" in data:  # only files that can hold compiled code count
            h.update(os.path.relpath(path, PACKAGE_DIR).encode())
            h.update(data)
    return h.hexdigest()


def package_source_stamp() -> str:
    """A digest of the ``.py`` files of this package that mention numba (and numba's version).

    numba's own stamp covers only the file that defines a function, so a cached cfunc would keep
    stale code after an edit of a kernel it calls in another file; this stamp changes with any of
    them. Files without numba code (specs, references, registration) do not invalidate the cache.
    """
    stats = []
    for path in _package_sources():
        st = os.stat(path)
        stats.append((path, st.st_mtime_ns, st.st_size))
    return _digest(tuple(stats))


def _install_cache_locator() -> bool:
    """Route numba's on-disk cache of this package's functions to ``cache_root()``, stamped with
    ``package_source_stamp()``. Functions elsewhere keep numba's usual locators. Returns False when
    numba's internals differ (then ``NUMBA_CACHE_DIR`` is pointed at ``cache_root()`` if unset)."""
    try:
        from numba.core import caching
        base, impl = caching._CacheLocator, caching.CacheImpl
        impl._locator_classes  # noqa: B018 - probe the attribute
    except (ImportError, AttributeError):
        if not os.environ.get("NUMBA_CACHE_DIR"):
            os.environ["NUMBA_CACHE_DIR"] = cache_root()
            numba.config.CACHE_DIR = cache_root()
        return False

    class OrtfuseCacheLocator(base):
        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = os.path.join(cache_root(), self.get_suitable_cache_subpath(py_file))

        def get_cache_path(self):
            return self._cache_path

        def get_source_stamp(self):
            return package_source_stamp()

        def get_disambiguator(self):
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func, py_file):
            path = os.path.abspath(py_file)
            if not path.startswith(PACKAGE_DIR + os.sep) or not os.path.exists(path):
                return None
            self = cls(py_func, path)
            try:
                self.ensure_cache_path()
            except OSError:
                return None
            return self

    if not any(getattr(c, "__name__", "") == "OrtfuseCacheLocator" for c in impl._locator_classes):
        impl._locator_classes.insert(0, OrtfuseCacheLocator)
    return True


def _configure_threading_layer() -> None:
    """Prefer numba's OpenMP layer: parallel kernels run from ORT's threads and from several Python
    threads at once, which the ``workqueue`` layer does not survive (DESIGN.md §4b). Left alone when
    the user chose a layer, when numba's threads already started, or when OpenMP is missing."""
    if os.environ.get("NUMBA_THREADING_LAYER"):
        return
    try:
        from numba.np.ufunc import parallel
        if parallel._is_initialized:
            return
        from numba.np.ufunc import omppool  # noqa: F401 - is the OpenMP layer importable?
    except ImportError:
        return
    numba.config.THREADING_LAYER = "omp"


CACHE_LOCATOR_INSTALLED = _install_cache_locator()
_configure_threading_layer()

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
    ("GetInputCharacteristic", 8),    # read from 8 on; NULL crashes ORT even below (DESIGN.md §4)
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

# numba signatures of the callbacks (pointers as int64)
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
# numba intrinsics
# --------------------------------------------------------------------------------------------------

_I8P = ir.IntType(8).as_pointer()
_LL = {"i64": ir.IntType(64), "i32": ir.IntType(32), "i8": ir.IntType(8),
       "f32": ir.FloatType(), "f64": ir.DoubleType()}
_NB = {"i64": types.int64, "i32": types.int32, "i8": types.uint8, "f32": types.float32, "f64": types.float64}


def _make_load(kind):
    @intrinsic
    def load(typingctx, addr):
        if not isinstance(addr, types.Integer):
            raise TypingError("address must be an integer")

        def codegen(context, builder, sig, args):
            ptr = builder.inttoptr(args[0], _LL[kind].as_pointer())
            return builder.load(ptr, align=1 if kind == "i8" else None)

        return _NB[kind](addr), codegen

    return load


def _make_store(kind):
    @intrinsic
    def store(typingctx, addr, value):
        if not isinstance(addr, types.Integer):
            raise TypingError("address must be an integer")

        def codegen(context, builder, sig, args):
            val = context.cast(builder, args[1], sig.args[1], _NB[kind])
            builder.store(val, builder.inttoptr(args[0], _LL[kind].as_pointer()))
            return context.get_dummy_value()

        return types.void(addr, value), codegen

    return store


load_i64 = _make_load("i64")
load_i32 = _make_load("i32")
load_u8 = _make_load("i8")
load_f32 = _make_load("f32")
load_f64 = _make_load("f64")
store_i64 = _make_store("i64")
store_i32 = _make_store("i32")
store_u8 = _make_store("i8")
store_f32 = _make_store("f32")
store_f64 = _make_store("f64")


def _make_prefetch(write: int):
    @intrinsic
    def prefetch(typingctx, addr):
        if not isinstance(addr, types.Integer):
            raise TypingError("address must be an integer")

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [_I8P, i32, i32, i32]), "llvm.prefetch.p0i8")
            builder.call(fn, [builder.inttoptr(args[0], _I8P), i32(write), i32(3), i32(1)])  # rw, L1, data
            return context.get_dummy_value()

        return types.void(addr), codegen

    return prefetch


# Cache hints for the line holding an address (prefetcht0 / prefetchw): never fault, whatever the
# address; prefetch_write fetches the line owned, so a later store does not wait for it.
prefetch_read = _make_prefetch(0)
prefetch_write = _make_prefetch(1)


@njit(nogil=True, cache=True)
def prefetch_lines(addr, nbytes, write):
    """Hint every 64-byte line of [addr, addr + nbytes): prefetch_write if ``write``, else prefetch_read.
    Inlined: called between pieces of a vectorised loop, a call costs as much as the hints help."""
    always_inline()
    for off in range(0, nbytes, 64):
        if write:
            prefetch_write(addr + off)
        else:
            prefetch_read(addr + off)


@intrinsic
def int_to_voidptr(typingctx, addr):
    """An integer address as ``void*``, e.g. for ``numba.carray(int_to_voidptr(a), n, np.float32)``."""
    if not isinstance(addr, types.Integer):
        raise TypingError("address must be an integer")

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], _I8P)

    return types.voidptr(addr), codegen


@intrinsic
def voidptr_to_int(typingctx, ptr):
    """The address held by a ``void*`` as int64."""
    def codegen(context, builder, sig, args):
        return builder.ptrtoint(args[0], ir.IntType(64))

    return types.int64(ptr), codegen


@intrinsic
def stack_bytes(typingctx, nbytes):
    """Address of ``nbytes`` of zeroed, 64-byte aligned stack memory in the *calling* function's frame.

    ``nbytes`` must be a compile-time constant. The memory lives until the function that contains the
    call returns: call it in the cfunc body (or an inlined helper), never in a helper that returns it.
    """
    if not isinstance(nbytes, types.IntegerLiteral):
        raise RequireLiteralValue("stack_bytes needs a constant size")
    n = int(nbytes.literal_value)
    nwords = max(1, (n + 7) // 8)

    def codegen(context, builder, sig, args):
        buf = cgutils.alloca_once(builder, ir.ArrayType(ir.IntType(64), nwords))
        buf.align = 64
        builder.store(ir.Constant(ir.ArrayType(ir.IntType(64), nwords), None), buf)
        return builder.ptrtoint(buf, ir.IntType(64))

    return types.int64(nbytes), codegen


@intrinsic
def c_malloc(typingctx, nbytes):
    """libc ``malloc``; returns the address (0 on failure)."""
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_I8P, [ir.IntType(64)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "malloc")
        n = context.cast(builder, args[0], sig.args[0], types.int64)
        return builder.ptrtoint(builder.call(fn, [n]), ir.IntType(64))

    return types.int64(nbytes), codegen


@intrinsic
def c_free(typingctx, addr):
    """libc ``free``."""
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.VoidType(), [_I8P])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "free")
        builder.call(fn, [builder.inttoptr(args[0], _I8P)])
        return context.get_dummy_value()

    return types.void(addr), codegen


@intrinsic
def atomic_cas_i64(typingctx, addr, expected, desired):
    """Compare-and-swap an int64 at ``addr`` (sequentially consistent); returns the old value."""
    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        exp = context.cast(builder, args[1], sig.args[1], types.int64)
        des = context.cast(builder, args[2], sig.args[2], types.int64)
        res = builder.cmpxchg(ptr, exp, des, "seq_cst", "seq_cst")
        return builder.extract_value(res, 0)

    return types.int64(addr, expected, desired), codegen


@intrinsic
def atomic_add_i64(typingctx, addr, delta):
    """Atomically add ``delta`` to the int64 at ``addr``; returns the old value."""
    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        d = context.cast(builder, args[1], sig.args[1], types.int64)
        return builder.atomic_rmw("add", ptr, d, "seq_cst")

    return types.int64(addr, delta), codegen


@intrinsic
def atomic_xchg_i64(typingctx, addr, value):
    """Atomically store ``value`` at ``addr`` (sequentially consistent); returns the old value."""
    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        v = context.cast(builder, args[1], sig.args[1], types.int64)
        return builder.atomic_rmw("xchg", ptr, v, "seq_cst")

    return types.int64(addr, value), codegen


def _make_call_intrinsic(nargs: int, ret: str, index: int | None, name: str):
    """An intrinsic calling a C function by address with ``nargs`` int64 arguments.

    ``index`` None: ``f(fn_addr, a0, ...)`` calls ``fn_addr``. Otherwise ``f(api, a0, ...)`` calls the
    ``index``-th function of the OrtApi table at ``api`` (the table load is inlined at the call site,
    so these wrappers cost no separate compilation). ``ret`` is "i64", "i32" or "void".
    """
    ll_ret = {"i64": ir.IntType(64), "i32": ir.IntType(32), "void": ir.VoidType()}[ret]
    nb_ret = {"i64": types.int64, "i32": types.int32, "void": types.void}[ret]

    def typer(typingctx, head, *args):
        if len(args) != nargs:
            raise TypingError(f"{name} takes {nargs + 1} arguments")
        for a in (head, *args):
            if not isinstance(a, types.Integer):
                raise TypingError(f"{name}: arguments must be integers (addresses or values)")

        def codegen(context, builder, sig, llargs):
            fnty = ir.FunctionType(ll_ret, [ir.IntType(64)] * nargs)
            head_val = context.cast(builder, llargs[0], sig.args[0], types.int64)
            if index is None:
                fn_addr = head_val
            else:
                slot = builder.add(head_val, ir.Constant(ir.IntType(64), 8 * index))
                fn_addr = builder.load(builder.inttoptr(slot, ir.IntType(64).as_pointer()))
            fptr = builder.inttoptr(fn_addr, fnty.as_pointer())
            cargs = [context.cast(builder, v, t, types.int64) for v, t in zip(llargs[1:], sig.args[1:])]
            res = builder.call(fptr, cargs)
            return context.get_dummy_value() if ret == "void" else res

        return nb_ret(head, *args), codegen

    # numba's @intrinsic reads the typer's parameter list: give it fixed positional parameters
    params = "".join(f", a{i}" for i in range(nargs))
    ns = {"typer": typer}
    source = f"def {name}(typingctx, head{params}):\n    return typer(typingctx, head{params})\n"
    exec(source, ns)  # noqa: S102 - numba intrinsics reject *args, so the typer is generated
    return intrinsic(ns[name])


# indirect calls of a function address: icallN(fn_addr, a0, ..., aN-1)
icall2_void = _make_call_intrinsic(2, "void", None, "icall2_void")
icall3_void = _make_call_intrinsic(3, "void", None, "icall3_void")

# --------------------------------------------------------------------------------------------------
# OrtApi functions as intrinsics: f(api, args...) with `api` the `const OrtApi*` ORT passed to
# CreateKernel (int64). Out-parameters are addresses of caller memory (stack_bytes). Functions
# returning OrtStatus* return its address (0 = success).
# --------------------------------------------------------------------------------------------------

create_status = _make_call_intrinsic(2, "i64", CREATE_STATUS, "create_status")
"""create_status(api, code, msg_addr) -> OrtStatus*: ORT copies the NUL-terminated message."""
get_error_code = _make_call_intrinsic(1, "i32", GET_ERROR_CODE, "get_error_code")
"""get_error_code(api, status) -> OrtErrorCode."""
get_error_message = _make_call_intrinsic(1, "i64", GET_ERROR_MESSAGE, "get_error_message")
"""get_error_message(api, status) -> address of the message (owned by the status)."""
_release_status = _make_call_intrinsic(1, "void", RELEASE_STATUS, "release_status")
kernel_info_get_float = _make_call_intrinsic(3, "i64", KERNEL_INFO_GET_ATTRIBUTE_FLOAT, "kernel_info_get_float")
"""kernel_info_get_float(api, info, name_addr, out_addr): writes a float32 at out_addr."""
kernel_info_get_int64 = _make_call_intrinsic(3, "i64", KERNEL_INFO_GET_ATTRIBUTE_INT64, "kernel_info_get_int64")
kernel_info_get_string = _make_call_intrinsic(4, "i64", KERNEL_INFO_GET_ATTRIBUTE_STRING,
                                              "kernel_info_get_string")
"""kernel_info_get_string(api, info, name_addr, out_addr, size_addr): *size is the buffer size in,
the length including NUL out; a too-small buffer gives an error status (and the needed size)."""
kernel_info_get_floats = _make_call_intrinsic(4, "i64", KERNEL_INFO_GET_ATTRIBUTE_ARRAY_FLOAT,
                                              "kernel_info_get_floats")
"""kernel_info_get_floats(api, info, name_addr, out_addr, size_addr): a FLOATS attribute as float32
values; *size is the capacity in elements in, the count out (too small: error status, needed count)."""
kernel_info_get_ints = _make_call_intrinsic(4, "i64", KERNEL_INFO_GET_ATTRIBUTE_ARRAY_INT64, "kernel_info_get_ints")
"""kernel_info_get_ints(api, info, name_addr, out_addr, size_addr): an INTS attribute as int64, like
kernel_info_get_floats."""
context_input_count = _make_call_intrinsic(2, "i64", KERNEL_CONTEXT_GET_INPUT_COUNT, "context_input_count")
context_output_count = _make_call_intrinsic(2, "i64", KERNEL_CONTEXT_GET_OUTPUT_COUNT, "context_output_count")
context_get_input = _make_call_intrinsic(3, "i64", KERNEL_CONTEXT_GET_INPUT, "context_get_input")
"""context_get_input(api, ctx, index, out_addr): writes the const OrtValue* (0 if absent)."""
context_get_output = _make_call_intrinsic(5, "i64", KERNEL_CONTEXT_GET_OUTPUT, "context_get_output")
"""context_get_output(api, ctx, index, dims_addr, rank, out_addr): allocates output `index`."""
context_parallel_for = _make_call_intrinsic(5, "i64", KERNEL_CONTEXT_PARALLEL_FOR, "context_parallel_for")
"""context_parallel_for(api, ctx, fn_addr, total, num_batch, usr_data): runs fn(usr_data, i) for
i < total on the session's intra-op thread pool and returns when all are done (API 17+)."""
get_tensor_type_and_shape = _make_call_intrinsic(2, "i64", GET_TENSOR_TYPE_AND_SHAPE, "get_tensor_type_and_shape")
get_tensor_element_type = _make_call_intrinsic(2, "i64", GET_TENSOR_ELEMENT_TYPE, "get_tensor_element_type")
"""get_tensor_element_type(api, info, out_addr): writes a 32-bit ONNXTensorElementDataType."""
get_dimensions_count = _make_call_intrinsic(2, "i64", GET_DIMENSIONS_COUNT, "get_dimensions_count")
get_dimensions = _make_call_intrinsic(3, "i64", GET_DIMENSIONS, "get_dimensions")
get_tensor_shape_element_count = _make_call_intrinsic(2, "i64", GET_TENSOR_SHAPE_ELEMENT_COUNT,
                                                      "get_tensor_shape_element_count")
_release_tensor_type_and_shape_info = _make_call_intrinsic(1, "void", RELEASE_TENSOR_TYPE_AND_SHAPE_INFO,
                                                           "release_tensor_type_and_shape_info")
get_tensor_mutable_data = _make_call_intrinsic(2, "i64", GET_TENSOR_MUTABLE_DATA, "get_tensor_mutable_data")
get_allocator_with_default_options = _make_call_intrinsic(1, "i64", GET_ALLOCATOR_WITH_DEFAULT_OPTIONS,
                                                          "get_allocator_with_default_options")
create_tensor_as_ort_value = _make_call_intrinsic(5, "i64", CREATE_TENSOR_AS_ORT_VALUE, "create_tensor_as_ort_value")
"""create_tensor_as_ort_value(api, allocator, dims_addr, rank, elem_type, out_addr): a tensor owned
by the caller (release it with release_value)."""
_release_value = _make_call_intrinsic(1, "void", RELEASE_VALUE, "release_value")


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


# --------------------------------------------------------------------------------------------------
# C strings and messages inside numba code
# --------------------------------------------------------------------------------------------------


def cstr(text: str) -> np.ndarray:
    """A NUL-free uint8 array for message text; as a module global it is a numba compile-time constant."""
    data = text.encode("utf-8")
    if b"\0" in data:
        raise ValueError("message text must not contain NUL")
    return np.frombuffer(data, dtype=np.uint8).copy()


@njit(cache=True)
def msg_put(buf, cap, n, text):
    """Append the bytes of ``text`` (a uint8 array) to the message at address ``buf``; returns the new length."""
    for i in range(text.shape[0]):
        if n >= cap - 1:
            break
        store_u8(buf + n, text[i])
        n += 1
    return n


@njit(cache=True)
def msg_put_cstr(buf, cap, n, addr):
    """Append a NUL-terminated C string at ``addr``."""
    if addr == 0:
        return n
    i = 0
    while n < cap - 1:
        c = load_u8(addr + i)
        if c == 0:
            break
        store_u8(buf + n, c)
        n += 1
        i += 1
    return n


@njit(cache=True)
def msg_put_int(buf, cap, n, value):
    """Append a decimal integer."""
    v = np.int64(value)
    if v < 0:
        if n < cap - 1:
            store_u8(buf + n, 45)  # '-'
            n += 1
        v = -v
    p = np.int64(1)
    while p <= v // 10:
        p *= 10
    while p > 0 and n < cap - 1:
        store_u8(buf + n, 48 + (v // p) % 10)
        n += 1
        p //= 10
    return n


@njit(cache=True)
def msg_put_dims(buf, cap, n, dims_addr, rank):
    """Append ``[d0,d1,...]`` from ``rank`` int64 values at ``dims_addr``."""
    if n < cap - 1:
        store_u8(buf + n, 91)  # '['
        n += 1
    for i in range(rank):
        if i > 0 and n < cap - 1:
            store_u8(buf + n, 44)  # ','
            n += 1
        n = msg_put_int(buf, cap, n, load_i64(dims_addr + 8 * i))
    if n < cap - 1:
        store_u8(buf + n, 93)  # ']'
        n += 1
    return n


@njit(cache=True)
def msg_status(api, code, buf, n):
    """NUL-terminate the message at ``buf`` and wrap it in a new OrtStatus (ORT copies the text)."""
    store_u8(buf + n, 0)
    return create_status(api, code, buf)
