"""Build the ops library: ``python -m ortfuse.custom_ops.aot.build --isa LEVEL --key KEY --out PATH``.

Run as its own process with numba targeting the ISA level (``foundation.isa.numba_env``) and an empty
numba cache (``NUMBA_CACHE_DIR``): ``library.build`` starts it so. Steps (docs/ARCHITECTURE.md §6b):

1. the units: every native op's compute and worker (``registration.library_op_table``: the
   ops whose instructions the level has) and the shared callbacks of ``native.callbacks.NUMBA_CALLBACKS``,
   each with a C symbol;
2. objects: one per unit, compiled by ``--jobs`` worker processes (``objects.build_object`` for the
   level's CPU), each taking the next unit when done;
3. glue: the records of every op, built by ``native.records.OpRecord`` with tokens for the
   functions, as C (``glue.c_source``);
4. link (``toolchain.link_shared``) into a temporary file, checked by loading it, then renamed over
   ``--out`` (atomic: a reader sees the old file or the new one).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
import tempfile
import time
import types

ALLOWED_UNDEFINED = re.compile(r"^(NRT_MemInfo_call_dtor|ortfuse_aot_failure|[a-z][a-z0-9]*)$")
"""Symbols the objects may leave to the glue, libc and libm (lower-case C names such as ``expf``);
anything else (numba's runtime, the Python C API) fails the build."""


def _symbol(fn) -> str:
    return "ortfuse_fn_" + re.sub(r"\W", "_", f"{fn.__module__.rpartition('.')[2]}_{fn.__qualname__}")


def units(level: str):
    """The units of the ops library of ISA ``level``: every op's compute and worker
    (``registration.library_op_table``) and every shared callback."""
    from ortfuse.custom_ops.aot.objects import Unit
    from ortfuse.custom_ops.native.callbacks import NUMBA_CALLBACKS
    from ortfuse.custom_ops.ort_api import SIG_CREATE_KERNEL_V2, SIG_KERNEL_COMPUTE_V2, SIG_WORKER
    from ortfuse.custom_ops.registration import library_op_table

    found: dict = {}
    for fn, sig in NUMBA_CALLBACKS.values():
        found[fn] = Unit(_symbol(fn), fn, sig, ("arg", 1) if sig == SIG_CREATE_KERNEL_V2 else None)
    for op in library_op_table(level).values():
        found.setdefault(op.compute, Unit(_symbol(op.compute), op.compute, SIG_KERNEL_COMPUTE_V2, ("slot", 0)))
        if op.worker is not None:
            found.setdefault(op.worker, Unit(_symbol(op.worker), op.worker, SIG_WORKER, None))
    symbols = [u.symbol for u in found.values()]
    if len(set(symbols)) != len(symbols):
        raise RuntimeError("two native callbacks map to one C symbol")
    return list(found.values())


def _records(all_units, level: str):
    """The OpRecords of the library's ops, with tokens for functions and the pool; and the tokens."""
    from ortfuse.custom_ops.aot.glue import POOL_SYMBOL, Tokens
    from ortfuse.custom_ops.native.callbacks import IR_CALLBACKS, NUMBA_CALLBACKS
    from ortfuse.custom_ops.native.records import OpRecord
    from ortfuse.custom_ops.registration import library_op_table

    tokens = Tokens()
    symbol = {u.fn: u.symbol for u in all_units}
    callbacks = {field: tokens.get(spec[0]).address for field, spec in IR_CALLBACKS.items()}
    callbacks.update({field: tokens.get(symbol[fn]).address for field, (fn, _sig) in NUMBA_CALLBACKS.items()})
    pool = tokens.get(POOL_SYMBOL).address
    records = []
    for i, op in enumerate(library_op_table(level).values()):
        worker = tokens.get(symbol[op.worker]) if op.worker is not None else None
        records.append(OpRecord(op, i + 1, pool, callbacks, tokens.get(symbol[op.compute]), worker))
    return records, tokens


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def compile_cost(fn, seen: set | None = None) -> int:
    """Bytes of Python bytecode numba compiles for ``fn``: its own and that of every function it
    names, transitively (numba dispatchers through ``py_func``). A proxy for the unit's compile time,
    known before compiling; the build starts the costliest units first."""
    seen = set() if seen is None else seen
    py = getattr(fn, "py_func", fn)
    if not isinstance(py, types.FunctionType) or py in seen:
        return 0
    seen.add(py)
    total = len(py.__code__.co_code)
    for name in _code_names(py.__code__):
        total += compile_cost(py.__globals__.get(name), seen)
    return total


def _compile_unit(job: tuple[int, str, str]) -> list[str]:
    """In a worker process: unit ``index`` into the object file ``out``; returns its undefined symbols."""
    from ortfuse.custom_ops.aot.objects import build_object
    from ortfuse.foundation.isa import numba_env

    index, isa, out = job
    env = numba_env(isa)
    return build_object([units(isa)[index]], env["NUMBA_CPU_NAME"], env["NUMBA_CPU_FEATURES"], out)


def _compile_all(all_units: list, isa: str, workdir: str, jobs: int) -> list[str]:
    """One object per unit, compiled by ``jobs`` worker processes that each take the next unit when
    done, costliest first (``compile_cost``): the units' compile times differ by 100x, and a long
    unit started last would leave the other workers idle."""
    import multiprocessing

    n_units = len(all_units)
    outs = [os.path.join(workdir, f"unit{i}.o") for i in range(n_units)]
    order = sorted(range(n_units), key=lambda i: -compile_cost(all_units[i].fn))
    jobs_list = [(i, isa, outs[i]) for i in order]
    from ortfuse.custom_ops.aot.objects import skip_jit_codegen

    with multiprocessing.get_context("spawn").Pool(max(1, min(jobs, n_units)), initializer=skip_jit_codegen) as pool:
        undefined = set().union(*pool.imap_unordered(_compile_unit, jobs_list, chunksize=1))
    bad = sorted(s for s in undefined if not ALLOWED_UNDEFINED.match(s))
    if bad:
        raise RuntimeError("compiling the kernels failed: they need symbols no plain process has: "
                           + ", ".join(bad[:5]))
    return outs


def build(out_path: str, isa: str, key: str, jobs: int, version: str = "") -> dict:
    """Build the library at ``out_path``; returns what was built (ops, seconds per step)."""
    from ortfuse.custom_ops.aot.glue import c_source
    from ortfuse.custom_ops.aot.toolchain import link_shared
    from ortfuse.custom_ops.native.callbacks import IR_CALLBACKS
    from ortfuse.custom_ops.native.threads import DEFAULT_PARALLEL_MIN
    from ortfuse.custom_ops.registration import library_op_table
    from ortfuse.custom_ops.specs import DOMAIN
    from ortfuse.foundation.isa import ISA_LEVELS

    t0 = time.perf_counter()
    all_units = units(isa)
    records, tokens = _records(all_units, isa)
    folder = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ortfuse-aot-") as workdir:
        objects = _compile_all(all_units, isa, workdir, jobs)
        t1 = time.perf_counter()
        source = c_source(records, tokens, IR_CALLBACKS, [u.symbol for u in all_units], key=key, isa=isa,
                          domain=DOMAIN, parallel_min=DEFAULT_PARALLEL_MIN, version=version,
                          omitted=tuple(sorted(set(library_op_table(ISA_LEVELS[0])) - set(library_op_table(isa)))))
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=folder)
        os.close(fd)
        try:
            link_shared(source, objects, tmp, workdir)
            lib = ctypes.CDLL(tmp)  # loads: every symbol resolved
            lib.ortfuse_aot_count.restype = ctypes.c_int64
            if lib.ortfuse_aot_count() != len(records):
                raise RuntimeError("the linked library lists the wrong number of ops")
            os.replace(tmp, out_path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return {"ops": [r.op_def.name for r in records], "compile_s": round(t1 - t0, 1),
            "link_s": round(time.perf_counter() - t1, 1), "isa": isa}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ortfuse.custom_ops.aot.build", description=__doc__.splitlines()[0])
    ap.add_argument("--isa", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--key", default="")
    ap.add_argument("--version", default="", help="library.version(), checked before the library is loaded")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    print(json.dumps(build(args.out, args.isa, args.key, args.jobs, args.version)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
