"""Build side: the C source that turns the compiled callbacks into a library ORT can load.

It holds, as static data, every op's record exactly as ``native.records.OpRecord`` lays it out in
memory (the ``OrtCustomOp``, the extension words, the name, the attribute table and its strings),
the pool block the records point at, the trivial metadata callbacks (``callbacks.IR_CALLBACKS``, as C
functions) and the entry points (docs/ARCHITECTURE.md §6b):

* ``RegisterCustomOps(OrtSessionOptions*, const OrtApiBase*)``: ORT's standard entry point, used by
  ``SessionOptions.register_custom_ops_library(path)`` in any ORT host: one custom-op domain
  (``specs.DOMAIN``) with every op;
* ``ortfuse_aot_count()``, ``ortfuse_aot_name(i)``, ``ortfuse_aot_op(i)``: the records, which
  ortfuse's own sessions add to onnxruntime-extensions (``AddExternalCustomOp``) as the JIT path does;
* ``ortfuse_aot_use_pool(pool)``: point every record at the caller's pool block (the process's one
  set of counters and threading settings) instead of the library's own;
* ``ortfuse_aot_info()``: ``"key=<library key>;isa=<level>;version=<version>;omitted=<op,...>"``, checked when the
  library is loaded (``omitted``: the native ops a higher level's library holds, whose instructions
  this level lacks);
* ``ortfuse_aot_node_attrs(i)``: ``"module:function"`` of the op's ``NativeOpDef.node_attrs`` (""
  for none), so that planning a model needs neither the op families nor numba.

Records are recovered from memory: ``OpRecord``s are built with *tokens* in place of function and
pool addresses, and every word that holds a token or points into one of the record's own buffers
becomes a symbol reference in C; every other word is a plain integer.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass

from ortfuse.custom_ops import abi
from ortfuse.custom_ops.native.words import EXT, EXT_POOL, P_PAR_MIN, P_THREADING, POOL_WORDS, THREADS_ORT

TOKEN_BASE = 0x7FF0_0000_0000_0000  # above every user-space address: never a real buffer's
POOL_SYMBOL = "ortfuse_pool"


@dataclass
class Token:
    """Stands for a function (or the pool) where ``OpRecord`` expects a compiled object."""

    address: int
    symbol: str


class Tokens:
    """Token addresses for C symbols."""

    def __init__(self):
        self.by_address: dict[int, str] = {}
        self.by_symbol: dict[str, Token] = {}

    def get(self, symbol: str) -> Token:
        if symbol not in self.by_symbol:
            token = Token(TOKEN_BASE + 16 * len(self.by_symbol), symbol)
            self.by_symbol[symbol] = token
            self.by_address[token.address] = symbol
        return self.by_symbol[symbol]


def _c_string(data: bytes) -> str:
    return "{" + ", ".join(str(b) for b in data) + "}"


class _Blocks:
    """The buffers of the records, by address: name -> (address, size, kind)."""

    def __init__(self):
        self.items: list[tuple[str, int, int, str, object]] = []

    def add(self, name: str, obj, kind: str) -> None:
        self.items.append((name, ctypes.addressof(obj), ctypes.sizeof(obj), kind, obj))

    def symbol_for(self, value: int) -> str | None:
        for name, addr, size, _kind, _obj in self.items:
            if addr <= value < addr + size:
                off = value - addr
                return f"((char*){name} + {off})" if off else f"(char*){name}"
        return None


def _collect(records) -> _Blocks:
    blocks = _Blocks()
    for i, rec in enumerate(records):
        blocks.add(f"ortfuse_rec_{i}", rec.record, "words")
        blocks.add(f"ortfuse_name_{i}", rec.name, "bytes")
        table = rec.attributes
        blocks.add(f"ortfuse_attrs_{i}", table.table, "words")
        for j, name in enumerate(table.names):
            blocks.add(f"ortfuse_attrname_{i}_{j}", name, "bytes")
        for j, (strings, choices) in enumerate(zip(table.choice_strings, table.choice_tables, strict=True)):
            blocks.add(f"ortfuse_choices_{i}_{j}", choices, "words")
            for k, s in enumerate(strings):
                blocks.add(f"ortfuse_choice_{i}_{j}_{k}", s, "bytes")
    return blocks


def _word(value: int, blocks: _Blocks, tokens: Tokens) -> str:
    if value in tokens.by_address:
        return f"(void*)&{tokens.by_address[value]}"
    ref = blocks.symbol_for(value)
    if ref is not None:
        return f"(void*){ref}"
    return f"(void*){value & 0xFFFF_FFFF_FFFF_FFFF:#x}ULL"


def _metadata_functions(ir_callbacks: dict) -> list[str]:
    """C definitions of the metadata callbacks (``callbacks.IR_CALLBACKS``: field -> (symbol, return
    type, int64 argument count, body))."""
    ctype = {"i64": "int64_t", "i32": "int32_t", "void": "void"}
    out, done = [], set()
    for symbol, ret, nargs, body in ir_callbacks.values():
        if symbol in done:
            continue
        done.add(symbol)
        params = ", ".join(f"int64_t a{i}" for i in range(nargs))
        if body is None:
            stmt = ""
        elif body[0] == "const":
            stmt = f"return ({ctype[ret]}){body[1]};"
        else:
            stmt = f"return ({ctype[ret]})((const int64_t*)(a0 + {EXT}))[{body[1]}];"
        unused = " ".join(f"(void)a{i};" for i in range(nargs))
        out.append(f"{ctype[ret]} {symbol}({params}) {{ {unused} {stmt} }}")
    return out


def _function_ref(fn) -> str:
    """``module:qualname`` of a module-level function, "" for None."""
    if fn is None:
        return ""
    ref = f"{fn.__module__}:{fn.__qualname__}"
    if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", ref):
        raise ValueError(f"node_attrs must be a module-level function, not {ref}")
    return ref


def c_source(records, tokens: Tokens, ir_callbacks: dict, unit_symbols: list[str], *, key: str, isa: str,
             domain: str, parallel_min: int, omitted: tuple[str, ...] = (), version: str = "") -> str:
    """The glue's C source for ``records`` (``OpRecord``s built with ``tokens``); each record's op
    definition names its ``node_attrs`` function (``module:qualname``) for ``ortfuse_aot_node_attrs``."""
    blocks = _collect(records)
    lines = ["#include <stdint.h>", "#include <stddef.h>", "#include <string.h>", ""]
    lines += [f"extern void {s}(void);" for s in unit_symbols]
    lines += [f"int64_t {POOL_SYMBOL}[{POOL_WORDS}] = {{[{P_THREADING}] = {THREADS_ORT}, "
              f"[{P_PAR_MIN}] = {parallel_min}}};"]
    lines += _metadata_functions(ir_callbacks)
    for name, _addr, _size, kind, obj in blocks.items:  # declarations first: blocks point at each other
        lines.append(f"static char {name}[{ctypes.sizeof(obj)}];" if kind == "bytes"
                     else f"static void* {name}[{ctypes.sizeof(obj) // 8}];")
    for name, _addr, size, kind, obj in blocks.items:
        raw = ctypes.string_at(ctypes.addressof(obj), size)
        if kind == "bytes":
            lines.append(f"static char {name}[{size}] = {_c_string(raw)};")
        else:
            words = [int.from_bytes(raw[i:i + 8], "little") for i in range(0, size, 8)]
            body = ", ".join(_word(w, blocks, tokens) for w in words)
            lines.append(f"static void* {name}[{size // 8}] = {{{body}}};")
    n = len(records)
    lines.append(f"static void** const ortfuse_records[{max(n, 1)}] = {{"
                 + ", ".join(f"ortfuse_rec_{i}" for i in range(n)) + "};")
    lines.append(f"static char* const ortfuse_names[{max(n, 1)}] = {{"
                 + ", ".join(f"ortfuse_name_{i}" for i in range(n)) + "};")
    lines.append(f"static const char* const ortfuse_node_attrs[{max(n, 1)}] = {{"
                 + ", ".join(f'"{_function_ref(r.op_def.node_attrs)}"' for r in records) + "};")
    info = f"key={key};isa={isa};version={version};omitted={','.join(omitted)}"
    create_domain, domain_add, add_domain = (abi.REGISTRATION_API_INDEX[k] for k in
                                             ("CreateCustomOpDomain", "CustomOpDomain_Add", "AddCustomOpDomain"))
    lines.append(_ENTRY_POINTS.format(
        n=n, info=info, ext_pool=EXT // 8 + EXT_POOL, create_status=abi.CREATE_STATUS, fail=abi.ORT_FAIL,
        api_version=abi.MIN_RUNTIME_API_VERSION, create_domain=create_domain, domain_add=domain_add,
        add_domain=add_domain, domain=domain))
    return "\n".join(lines) + "\n"


_ENTRY_POINTS = r"""
typedef void* (*create_status_t)(int32_t, const char*);
typedef void* (*create_domain_t)(const char*, void**);
typedef void* (*domain_add_t)(void*, const void*);
typedef void* (*add_domain_t)(void*, void*);
typedef struct {{ const void* const* (*GetApi)(uint32_t); const char* (*GetVersionString)(void); }} api_base_t;

int64_t ortfuse_aot_count(void) {{ return {n}; }}
const char* ortfuse_aot_name(int64_t i) {{ return (i >= 0 && i < {n}) ? ortfuse_names[i] : NULL; }}
void* ortfuse_aot_op(int64_t i) {{ return (i >= 0 && i < {n}) ? (void*)ortfuse_records[i] : NULL; }}
const char* ortfuse_aot_info(void) {{ return "{info}"; }}
const char* ortfuse_aot_node_attrs(int64_t i) {{ return (i >= 0 && i < {n}) ? ortfuse_node_attrs[i] : NULL; }}

void ortfuse_aot_use_pool(int64_t pool) {{
  for (int64_t i = 0; i < {n}; i++) ortfuse_records[i][{ext_pool}] = (void*)pool;
}}

/* A callback raised an error numba's calling convention reports: an ORT error status. */
int64_t ortfuse_aot_failure(int64_t api) {{
  const void* const* table = (const void* const*)api;
  return (int64_t)((create_status_t)table[{create_status}])({fail},
      "ortfuse: a native kernel failed internally; run the model with ORTFUSE_NATIVE=0 and report it");
}}

/* numba's reference counting calls this when a runtime object dies; no code in this library makes
   one (the build refuses any numba allocation symbol), so it is never reached. */
void NRT_MemInfo_call_dtor(void* mi) {{ (void)mi; }}

void* RegisterCustomOps(void* options, const api_base_t* base) {{
  const void* const* api = base->GetApi({api_version});
  if (api == NULL) {{  /* an older ORT: the first API version still makes an error status */
    const void* const* api1 = base->GetApi(1);
    return ((create_status_t)api1[{create_status}])({fail},
        "the ortfuse ops library needs onnxruntime with API version {api_version} or newer");
  }}
  void* domain = NULL;
  void* status = ((create_domain_t)api[{create_domain}])("{domain}", &domain);
  if (status != NULL) return status;
  for (int64_t i = 0; i < {n}; i++) {{
    status = ((domain_add_t)api[{domain_add}])(domain, ortfuse_records[i]);
    if (status != NULL) return status;
  }}
  return ((add_domain_t)api[{add_domain}])(options, domain);
}}
"""
