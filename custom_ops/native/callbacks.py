"""The callbacks every native op shares: ``CreateKernelV2`` and ``KernelDestroy`` (numba cfuncs: a
slot from the pool with the node's attributes; the slot back) and the metadata callbacks (name,
counts, types, characteristics), trivial functions of the record emitted as LLVM IR stubs.
``shared_callbacks()`` builds them once per process: {OrtCustomOp field: address}."""

from __future__ import annotations

import threading

from llvmlite import ir
from numba import njit

from ortfuse.custom_ops import abi
from ortfuse.custom_ops.abi import ORT_FAIL
from ortfuse.custom_ops.intrinsics import load_i64, stack_bytes, store_i64
from ortfuse.custom_ops.native.attributes import read_attrs
from ortfuse.custom_ops.native.lifetime import KEEP, compile_cfunc
from ortfuse.custom_ops.native.slots import slot_alloc, slot_free
from ortfuse.custom_ops.native.words import (
    EXT,
    EXT_INPUT_TYPE,
    EXT_N_INPUTS,
    EXT_N_OUTPUTS,
    EXT_NAME,
    EXT_OUTPUT_TYPE,
    EXT_POOL,
    MSG_CAP,
    S_API,
    S_RECORD,
)
from ortfuse.custom_ops.ort_api import SIG_CREATE_KERNEL_V2, SIG_KERNEL_DESTROY
from ortfuse.custom_ops.status_messages import cstr, msg_put, msg_put_cstr, msg_status

_T_COLON = cstr(": ")
_T_NO_MEMORY = cstr("out of memory for kernel state")
_lock = threading.Lock()
_callbacks: dict = {}


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
    st = read_attrs(op, api, info, slot)
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


NUMBA_CALLBACKS = {
    # OrtCustomOp field: (python function, numba signature)
    "CreateKernelV2": (_cb_create_kernel_v2, SIG_CREATE_KERNEL_V2),
    "KernelDestroy": (_cb_kernel_destroy, SIG_KERNEL_DESTROY),
}

# Metadata callbacks: trivial functions of the record, emitted as LLVM IR and JIT-compiled by numba's
# code generator in milliseconds, where a numba cfunc each would be a compile of its own.
#   field: (symbol, return type, number of int64 arguments, body)
#   body: ("ext", word) returns that extension word, ("const", value) returns a constant.
IR_CALLBACKS = {
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
    for symbol, ret, nargs, body in IR_CALLBACKS.values():
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
    return library, {field: library.get_pointer_to_function(spec[0]) for field, spec in IR_CALLBACKS.items()}


def shared_callbacks() -> dict:
    """{OrtCustomOp field: address} of the shared callbacks, built (and kept) on first use."""
    with _lock:
        if not _callbacks:
            library, addresses = _build_ir_callbacks()
            KEEP.append(library)
            for field, (fn, sig) in NUMBA_CALLBACKS.items():
                addresses[field] = compile_cfunc(fn, sig).address
            _callbacks.update(addresses)
        return dict(_callbacks)
