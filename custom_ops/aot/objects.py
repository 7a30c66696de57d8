"""Build side (numba): compile native-op callbacks to one relocatable object file for one ISA level.

Each unit is a plain Python function with a cfunc signature (``ort_api.SIG_*``), compiled by numba
without its on-disk cache (a cached library holds machine code, not the LLVM IR this step needs). Its
C entry point is a wrapper of our own, exported under the unit's symbol::

    status = inner(&ret, &excinfo, args...)     # numba's calling convention
    if status != ok:  return failure            # see below
    return ret

numba's own cfunc wrapper is dropped: its error path calls into the Python C API (GIL, PyErr_*),
which a library loaded by a process without Python cannot have. On a raised error a callback that
returns an ``OrtStatus*`` returns ``ortfuse_aot_failure(api)`` (the glue's C function: an ORT error
status), one that returns nothing returns. Every other function is internalized and unreferenced
code removed, so the object exports exactly the units' symbols and needs only libc and libm
(docs/ARCHITECTURE.md §6b).
"""

from __future__ import annotations

from dataclasses import dataclass

from ortfuse.custom_ops.native.words import S_API

FAILURE_SYMBOL = "ortfuse_aot_failure"
"""``int64_t ortfuse_aot_failure(int64_t api)``: an ORT error status for a callback that raised."""


@dataclass(frozen=True)
class Unit:
    """One C entry point: ``symbol`` runs ``fn`` compiled with numba signature ``sig``; ``api_from``
    says where a status-returning callback finds the ``const OrtApi*`` for its failure status:
    ``("arg", i)`` the i-th argument, ``("slot", i)`` the kernel-state slot in argument i (its
    ``S_API`` word), None for callbacks that return nothing."""

    symbol: str
    fn: object
    sig: object
    api_from: tuple[str, int] | None


def _wrapper_module(cres, unit: Unit):
    """An LLVM module (llvmlite.ir) holding the C wrapper of one compiled unit."""
    from llvmlite import ir
    from numba.core import cgutils

    ctx = cres.target_context
    fndesc = cres.fndesc
    mod = ir.Module(name=f"wrap_{unit.symbol}")
    inner_ty = ctx.call_conv.get_function_type(fndesc.restype, fndesc.argtypes)
    inner = cgutils.get_or_insert_function(mod, inner_ty, fndesc.llvm_func_name)
    i64 = ir.IntType(64)
    void = unit.sig.return_type.__class__.__name__ == "NoneType"
    c_ret = ir.VoidType() if void else ctx.get_value_type(unit.sig.return_type)
    c_args = [ctx.get_value_type(t) for t in unit.sig.args]
    wrapper = ir.Function(mod, ir.FunctionType(c_ret, c_args), name=unit.symbol)
    builder = ir.IRBuilder(wrapper.append_basic_block("entry"))
    status, value = ctx.call_conv.call_function(builder, inner, fndesc.restype, fndesc.argtypes,
                                                list(wrapper.args))
    with builder.if_then(status.is_error, likely=False):
        if void:
            builder.ret_void()
        else:
            kind, index = unit.api_from or ("arg", 0)
            api = wrapper.args[index]
            if kind == "slot":
                addr = builder.add(api, ir.Constant(i64, 8 * S_API))
                api = builder.load(builder.inttoptr(addr, i64.as_pointer()))
            failure = cgutils.get_or_insert_function(mod, ir.FunctionType(i64, [i64]), FAILURE_SYMBOL)
            builder.ret(builder.call(failure, [api]))
    if void:
        builder.ret_void()
    else:
        builder.ret(value)
    return mod


def _linked_modules(library, seen: set) -> list:
    """The LLVM modules of the libraries ``library`` links against, recursively (numba links them
    into the JIT, not into the library's own module)."""
    found = []
    for lib in getattr(library, "_linking_libraries", ()):
        if id(lib) in seen:
            continue
        seen.add(id(lib))
        found.append(lib._get_module_for_linking())
        found.extend(_linked_modules(lib, seen))
    return found


def skip_jit_codegen() -> None:
    """In a build process: numba's JIT emits machine code for every library it finalizes (each
    njit dependency is finalized so its IR can be linked into the unit), code the build never runs;
    that code generation runs at LLVM's O0 here. The IR passes, whose output the object is made
    from, keep numba's levels. numba creates its JIT at the first ``@njit`` decoration, so this runs
    before any kernel module is imported (a worker's initializer). Measure with ``ortfuse
    ops-library --rebuild --json`` (compile_s)."""
    from numba.core import codegen

    if getattr(codegen.JITCPUCodegen, "_ortfuse_unoptimized_jit", False):
        return
    options_of = codegen.JITCPUCodegen._customize_tm_options

    def options(self, tm_options):
        options_of(self, tm_options)
        tm_options["opt"] = 0

    codegen.JITCPUCodegen._customize_tm_options = options
    codegen.JITCPUCodegen._ortfuse_unoptimized_jit = True


def _compile(unit: Unit):
    """numba's compile result for one unit, uncached (its library keeps the LLVM IR)."""
    from numba.core.ccallback import CFunc

    return CFunc(unit.fn, (unit.sig.args, unit.sig.return_type), {}, {"nopython": True})._compile_uncached()


def build_object(units: list[Unit], cpu: str, features: str, out_path: str) -> list[str]:
    """Compile ``units`` for ``cpu``/``features`` into the object file ``out_path``; returns the
    symbols it leaves undefined (libc and libm functions, and the glue's failure function)."""
    import llvmlite.binding as llvm

    from ortfuse.custom_ops.numba_setup import configure_numba

    configure_numba()
    module = None
    for unit in units:
        cres = _compile(unit)
        part = llvm.parse_assembly(cres.library.get_llvm_str())
        part.link_in(llvm.parse_assembly(str(_wrapper_module(cres, unit))))
        for linked in _linked_modules(cres.library, set()):
            part.link_in(linked, preserve=True)
        if module is None:
            module = part
        else:
            module.link_in(part)
    if module is None:
        raise ValueError("no units to build")
    keep = {u.symbol for u in units}
    for fn in module.functions:
        if not fn.is_declaration and fn.name not in keep:
            fn.linkage = llvm.Linkage.internal
    for gv in module.global_variables:
        if not gv.is_declaration:
            gv.linkage = llvm.Linkage.internal
    target = llvm.Target.from_triple(module.triple or llvm.get_process_triple())
    machine = target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic", codemodel="default")
    pto = llvm.create_pipeline_tuning_options(speed_level=0)
    builder = llvm.create_pass_builder(machine, pto)
    pm = llvm.create_new_module_pass_manager()
    pm.add_global_dead_code_eliminate_pass()
    pm.add_strip_dead_prototype_pass()
    pm.run(module, builder)
    module.verify()
    with open(out_path, "wb") as f:
        f.write(machine.emit_object(module))
    return sorted(fn.name for fn in module.functions if fn.is_declaration and not fn.name.startswith("llvm."))
