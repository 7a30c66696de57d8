"""AMX tiles from numba: tile instructions as LLVM inline asm, the Linux tile-data permission, bf16
conversion and packing, and the 32x32 bf16 GEMM micro-kernel of ``FusedGemmActBf16``
(``custom_ops/native/ops/gemm_bf16.py``; docs/ARCHITECTURE.md §5).

Micro-kernel interface. The op's driver (``gemm_bf16.gemm_compute`` / ``gemm_worker``) takes the
micro-kernel as four numba functions, bound at compile time (arguments whose numba type is the
function itself, so each call is a direct call, never through a pointer): ``request_tiles()``,
``configure_tiles(cfg_addr, rows)``, ``tile_block(a_addr, a_stride, kp, rows, b0_addr, b1_addr,
c_addr, c_stride)`` and ``release_tiles()``. This module has the AMX ones; ``amx_emulated.py`` has a model of the same
instructions in plain numba, so the driver (packing, X conversion, block loops, tails, epilogue) runs
and is tested on any x86-64 CPU.

Instructions. Each tile instruction is an ``@intrinsic`` that emits one inline-asm call (llvmlite
``IRBuilder.asm``) with the tile register fixed in the text: ``ldtilecfg``, ``tilerelease``,
``tilezero``, ``tileloadd``, ``tilestored`` and ``tdpbf16ps``. They are marked side-effecting and
clobber memory, so LLVM neither reorders nor drops them. numba's JIT never initialises LLVM's asm
parser (inline asm then aborts the process: "we don't have an asm parser for this target"), so the
intrinsics' code generation does (``llvmlite.binding.initialize_native_asmparser``, once) before
anything with inline asm is compiled. The mnemonics need a target with ``amx-tile``/``amx-bf16``:
compile these kernels only on such a CPU (the registry and ``gemm_bf16.unavailable_reason`` see to
that), or for such a target (``isa.numba_env("amx")`` in a fresh process: compiles, must not run;
tests/test_amx_codegen.py checks the instructions emitted so).

Permission. Linux hands tile data to a process only after
``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`` (syscall 158, 0x1023, 18); the first tile
instruction without it is a SIGILL. ``request_tile_permission()`` asks once per process (ctypes
``syscall``) and checks the grant with ARCH_GET_XCOMP_PERM; a refusal is an error string, never a crash.

Tiles (palette 1, 8 registers of up to 16 rows x 64 bytes). The micro-kernel computes a block of up to
32 rows x 32 columns as 2 x 2 fp32 C tiles: tmm0 = C[rows 0-15, cols 0-15], tmm1 = C[0-15, 16-31],
tmm2 = C[16-31, 0-15], tmm3 = C[16-31, 16-31]; tmm4 / tmm5 = A (bf16 X rows 0-15 / 16-31, 32 values
of K each), tmm6 / tmm7 = B (the packed W of columns 0-15 / 16-31, 16 K-pairs each). Per 32 of K:
4 loads, 4 ``tdpbf16ps`` (C += A * B, products of bf16 pairs summed into fp32). Tile configuration is
per thread: every worker call loads its own (rows = the rows it really has, so nothing reads or writes
rows beyond M) and releases the tiles when done.

Layouts:

* X rows, converted once per call: ``rows x Kp`` bf16 (uint16), row stride ``2 Kp + 64`` bytes
  (``a_row_elems``: a 4 KiB-multiple stride would put a tile's 16 rows in one L1 set; measure with
  ``python tools/amx_bench.py --shapes 64x4096x4096``), zero beyond K. ``Kp`` = K rounded up to 32.
* packed W (VNNI, "pair-interleaved"): per column tile of 16 columns a contiguous ``Kp/2 x 64``-byte
  matrix whose row p holds, for each of the 16 columns c, the two bf16 values W[2p, c], W[2p+1, c];
  zero beyond K and beyond N (``Np`` = N rounded up to 32). Column tile t starts at ``t * 32 Kp`` bytes.

bf16 conversion is round-to-nearest-even on the float32 bits; NaN stays NaN (quiet bit set), Inf and
overflow to Inf as RNE gives; float32 subnormals round like any other value (to a bf16 subnormal or
zero). ``tdpbf16ps`` itself treats bf16 denormal inputs as zero and flushes denormal results (Intel
SDM), which is below any tolerance a bf16 user has.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

import llvmlite.binding as _llvm
import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ortfuse.custom_ops.intrinsics import int_to_voidptr

_I8P = ir.IntType(8).as_pointer()
_I64 = ir.IntType(64)

TILE_ROWS = 16        # rows of a tile
TILE_BYTES = 64       # bytes of a tile row (16 fp32 / 32 bf16 / 16 bf16 pairs)
K_STEP = 32           # K consumed per tdpbf16ps (32 bf16 per A row)
BLOCK_ROWS = 32       # rows of the micro-kernel (2 row tiles)
BLOCK_COLS = 32       # columns of the micro-kernel (2 column tiles)
CFG_BYTES = 64


@njit(cache=True)
def round_up(v, m):
    """v rounded up to a multiple of m (Python and numba)."""
    return (v + m - 1) // m * m


# --------------------------------------------------------------------------------------------------
# tile instructions (inline asm)
# --------------------------------------------------------------------------------------------------


_asm_parser: list = []


def _asm_parser_ready():
    """Initialise LLVM's asm parser for the host target, once (inline asm needs it; numba does not)."""
    if not _asm_parser:
        _llvm.initialize_native_asmparser()
        _asm_parser.append(True)


def _asm0(text):
    """An intrinsic ``f()`` emitting the fixed instruction ``text``."""
    @intrinsic
    def f(typingctx):
        def codegen(context, builder, sig, args):
            _asm_parser_ready()
            builder.asm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", [], True)
            return context.get_dummy_value()
        return types.void(), codegen
    return f


def _asm_addr(text):
    """An intrinsic ``f(addr)`` emitting ``text`` with $0 = the address (a register)."""
    @intrinsic
    def f(typingctx, addr):
        def codegen(context, builder, sig, args):
            _asm_parser_ready()
            ptr = builder.inttoptr(context.cast(builder, args[0], sig.args[0], types.int64), _I8P)
            builder.asm(ir.FunctionType(ir.VoidType(), [_I8P]), text, "r,~{memory}", [ptr], True)
            return context.get_dummy_value()
        return types.void(addr), codegen
    return f


def _asm_addr_stride(text):
    """An intrinsic ``f(addr, stride)`` emitting ``text`` with memory operand ($0,$1,1)."""
    @intrinsic
    def f(typingctx, addr, stride):
        def codegen(context, builder, sig, args):
            _asm_parser_ready()
            ptr = builder.inttoptr(context.cast(builder, args[0], sig.args[0], types.int64), _I8P)
            st = context.cast(builder, args[1], sig.args[1], types.int64)
            builder.asm(ir.FunctionType(ir.VoidType(), [_I8P, _I64]), text, "r,r,~{memory}", [ptr, st], True)
            return context.get_dummy_value()
        return types.void(addr, stride), codegen
    return f


tile_loadconfig = _asm_addr("ldtilecfg ($0)")
tile_release = _asm0("tilerelease")
zero_c0, zero_c1, zero_c2, zero_c3 = (_asm0(f"tilezero %tmm{t}") for t in range(4))
load_a0, load_a1, load_b0, load_b1 = (_asm_addr_stride(f"tileloadd ($0,$1,1), %tmm{t}") for t in (4, 5, 6, 7))
store_c0, store_c1, store_c2, store_c3 = (_asm_addr_stride(f"tilestored %tmm{t}, ($0,$1,1)") for t in range(4))
# tdpbf16ps in AT&T order: B, A, C  (C += A * B)
dp_c0 = _asm0("tdpbf16ps %tmm6, %tmm4, %tmm0")
dp_c1 = _asm0("tdpbf16ps %tmm7, %tmm4, %tmm1")
dp_c2 = _asm0("tdpbf16ps %tmm6, %tmm5, %tmm2")
dp_c3 = _asm0("tdpbf16ps %tmm7, %tmm5, %tmm3")

# --------------------------------------------------------------------------------------------------
# Linux permission (Python, once per process)
# --------------------------------------------------------------------------------------------------

SYS_ARCH_PRCTL = 158            # x86-64
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

_perm_lock = threading.Lock()
_perm_result: list = []         # [None] granted, or [reason]


def _request_permission() -> str | None:
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return f"AMX tile permission is requested through Linux x86-64 arch_prctl; this is {platform.system()} " \
               f"{platform.machine()}"
    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    rc = syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_REQ_XCOMP_PERM), ctypes.c_long(XFEATURE_XTILEDATA))
    if rc != 0:
        err = ctypes.get_errno()
        return f"Linux refused the AMX tile-data permission (arch_prctl ARCH_REQ_XCOMP_PERM: {os.strerror(err)})"
    mask = ctypes.c_uint64(0)
    rc = syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_GET_XCOMP_PERM), ctypes.byref(mask))
    if rc != 0 or not (mask.value >> XFEATURE_XTILEDATA) & 1:
        return "Linux did not grant the AMX tile-data permission (ARCH_GET_XCOMP_PERM lacks XTILEDATA)"
    return None


@intrinsic
def _arch_prctl_request(typingctx):
    """``syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`` from compiled code: 0 when
    this process may use tile data (asking again is harmless), else -1 (errno set). The op's compute
    calls it before its first tile instruction, so a model saved with the op never meets a SIGILL,
    whoever registered it."""
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_I64, [_I64], var_arg=True)
        fn = cgutils.get_or_insert_function(builder.module, fnty, "syscall")
        return builder.call(fn, [ir.Constant(_I64, SYS_ARCH_PRCTL), ir.Constant(_I64, ARCH_REQ_XCOMP_PERM),
                                 ir.Constant(_I64, XFEATURE_XTILEDATA)])
    return types.int64(), codegen


@njit(nogil=True, cache=True)
def request_tiles():
    """Micro-kernel interface: 0 when this process may use tile data (``_arch_prctl_request``)."""
    return _arch_prctl_request()


def request_tile_permission() -> str | None:
    """Ask Linux for the tile-data permission once per process: None when granted, else the reason."""
    with _perm_lock:
        if not _perm_result:
            try:
                _perm_result.append(_request_permission())
            except (OSError, AttributeError) as exc:
                _perm_result.append(f"could not ask for the AMX tile-data permission: {exc}")
        return _perm_result[0]


# --------------------------------------------------------------------------------------------------
# bf16 conversion and packing
# --------------------------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def bf16_bits(b):
    """The bf16 (uint16 bits) nearest to the float32 with bits ``b`` (uint32), ties to even; NaN stays NaN."""
    b = np.uint32(b)
    if (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16((b >> np.uint32(16)) | np.uint32(0x0040))
    return np.uint16((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


def a_row_elems(kp: int) -> int:
    """Row stride (bf16 elements) of the converted X rows: Kp plus one cache line, so that where Kp is
    a multiple of 2048 (K = 4096, ...) the stride is no multiple of 4 KiB, which would put the 16 rows
    of an A tile in one L1 set. (Kp = 2016 + 2048 j still gives a 4 KiB-multiple stride.)"""
    return kp + TILE_BYTES // 2


@njit(nogil=True, cache=True)
def convert_rows(x_addr, k, r0, rows, kp, lda, dst_addr):
    """bf16 of X rows [r0, r0 + rows) (float32, K per row, at x_addr) into ``rows`` rows of ``lda``
    uint16 at dst_addr, zero from K to Kp."""
    dst = carray(int_to_voidptr(dst_addr), (rows * lda,), np.uint16)
    for i in range(rows):
        src = carray(int_to_voidptr(x_addr + 4 * (r0 + i) * k), (k,), np.uint32)
        d = dst[i * lda:i * lda + kp]
        for j in range(k):
            d[j] = bf16_bits(src[j])
        for j in range(k, kp):
            d[j] = 0


def packed_bytes(k: int, n: int) -> int:
    """Bytes of packed W data for K x N (Kp x Np bf16)."""
    return round_up(k, K_STEP) * round_up(n, BLOCK_COLS) * 2


@njit(nogil=True, cache=True)
def pack_weights(w_addr, k, n, kp, np_, dst_addr):
    """Pack W [K, N] (float32, row-major) into the pair-interleaved bf16 layout of the module
    docstring at dst_addr (``kp * np_`` uint16), zero-padded to Kp rows and Np columns."""
    w = carray(int_to_voidptr(w_addr), (k * n,), np.uint32)
    dst = carray(int_to_voidptr(dst_addr), (kp * np_,), np.uint16)
    for t in range(np_ // TILE_ROWS):
        base = t * kp * TILE_ROWS
        c0 = t * TILE_ROWS
        for kk in range(kp):
            row = base + (kk >> 1) * 32 + (kk & 1)
            if kk < k:
                wr = w[kk * n:(kk + 1) * n]
                for c in range(TILE_ROWS):
                    dst[row + 2 * c] = bf16_bits(wr[c0 + c]) if c0 + c < n else np.uint16(0)
            else:
                for c in range(TILE_ROWS):
                    dst[row + 2 * c] = 0


# --------------------------------------------------------------------------------------------------
# the micro-kernel
# --------------------------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def write_config(cfg_addr, rows0, rows1):
    """Tile configuration (palette 1) of a block with rows0 (1-16) rows in the first row tile and
    rows1 (0-16) in the second: tmm0/1/4 get rows0 rows, tmm2/3/5 rows1 (0: unused), tmm6/7 16."""
    cfg = carray(int_to_voidptr(cfg_addr), (CFG_BYTES,), np.uint8)
    for i in range(CFG_BYTES):
        cfg[i] = 0
    cfg[0] = 1
    rows = (rows0, rows0, rows1, rows1, rows0, rows1, TILE_ROWS, TILE_ROWS)
    for t in range(8):
        r = rows[t]
        if r > 0:
            cfg[16 + 2 * t] = TILE_BYTES   # colsb, little-endian uint16
            cfg[48 + t] = r


@njit(nogil=True, cache=True)
def configure_tiles(cfg_addr, rows):
    """Micro-kernel interface: configure this thread's tiles for blocks of ``rows`` rows (1-32):
    ``write_config`` into the CFG_BYTES at cfg_addr, then ``ldtilecfg``."""
    rows0 = min(TILE_ROWS, rows)
    write_config(cfg_addr, rows0, rows - rows0)
    tile_loadconfig(cfg_addr)


@njit(nogil=True, cache=True)
def tile_block(a_addr, a_stride, kp, rows, b0_addr, b1_addr, c_addr, c_stride):
    """Micro-kernel interface: C[rows, 32 cols] = A[rows, Kp] @ B (two packed column tiles), for the
    ``rows`` the tiles are configured for (``configure_tiles``); A rows are a_stride bytes apart; stores
    the C tiles at c_addr (row stride c_stride bytes; columns 16-31 at c_addr + 64; rows 16-31 at
    c_addr + 16 c_stride)."""
    two_rows = rows > TILE_ROWS
    a1_addr = a_addr + TILE_ROWS * a_stride
    zero_c0()
    zero_c1()
    if two_rows:
        zero_c2()
        zero_c3()
    for s in range(kp // K_STEP):
        load_a0(a_addr + TILE_BYTES * s, a_stride)
        load_b0(b0_addr + 1024 * s, TILE_BYTES)
        load_b1(b1_addr + 1024 * s, TILE_BYTES)
        dp_c0()
        dp_c1()
        if two_rows:
            load_a1(a1_addr + TILE_BYTES * s, a_stride)
            dp_c2()
            dp_c3()
    store_c0(c_addr, c_stride)
    store_c1(c_addr + TILE_BYTES, c_stride)
    if two_rows:
        store_c2(c_addr + TILE_ROWS * c_stride, c_stride)
        store_c3(c_addr + TILE_ROWS * c_stride + TILE_BYTES, c_stride)


@njit(nogil=True, cache=True)
def release_tiles():
    """Micro-kernel interface: ``tilerelease`` (the thread's tile state back to init)."""
    tile_release()
