"""numba intrinsics for code that works on raw addresses: loads and stores at integer addresses,
int-to-pointer (for ``numba.carray``), stack buffers, ``malloc``/``free``, atomics, cache hints and
indirect calls of a function address.

Pointers are plain ``int64`` values in numba code. ``make_call_intrinsic`` passes every argument as a
64-bit integer register and returns a 64-bit integer (or 32-bit for enum results): exact for
pointers, ``size_t`` and ``int64_t``, and correct for 32-bit enum arguments on the 64-bit System V
and AAPCS64 ABIs, where a callee reads only the low 32 bits of an integer register. Floats never
cross these calls by value (docs/ARCHITECTURE.md §6).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.errors import RequireLiteralValue, TypingError
from numba.extending import intrinsic

from ortfuse.custom_ops.vecmath import always_inline

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


def make_call_intrinsic(nargs: int, ret: str, index: int | None, name: str):
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
icall2_void = make_call_intrinsic(2, "void", None, "icall2_void")
icall3_void = make_call_intrinsic(3, "void", None, "icall3_void")
