"""``FusedGemmActBf16``: act(X[..., K] @ W[K, N] + B[N]) with the products on AMX bf16 tiles.

The same op as ``FusedGemmAct`` (inputs, ``activation`` attribute, shape checks and error statuses),
with another numeric contract: X and W are rounded to bf16 (round to nearest even) and multiplied by
``tdpbf16ps`` into float32 accumulators; bias and epilogue are float32 (``activation_span``). Each
product then carries a relative error of up to about 2^-7, so the op is never chosen by default: the
registry offers it only under the precision opt-in (``ortfuse.precision=bf16`` session config entry,
or ``ORTFUSE_PRECISION=bf16``) and only where the CPU reports amx-tile and amx-bf16 and Linux grants
the tile-data permission (``unavailable_reason``). Tile code, layouts and the permission:
``custom_ops/kernels/amx.py``. The native-op machinery it plugs into: docs/ARCHITECTURE.md §6.

W is packed once per kernel (bf16, pair-interleaved, padded to 32 x 32) into a malloc'd block kept in
the kernel slot's ``S_OWNED`` word, keyed by W's address and shape (the rewriter only emits this op
with W an initializer, whose buffer lives as long as the session); KernelDestroy frees it. The first
compute packs and publishes the block with a compare-and-swap (a concurrent first compute that loses
frees its own); a call whose W differs from the packed one packs a temporary copy for that call.

Work, in two ``run_blocks`` phases per call: (1) X converted to bf16 once, ``CONVERT_ROWS``
rows per block, into a buffer malloc'd per call (rows ``2 Kp + 64`` bytes apart); (2) GEMM blocks of
``SUPER_ROWS`` rows x a group of 32-column pairs. A GEMM block configures its thread's tiles (rows =
the rows it has, reloaded only when a row pair has fewer), and for each column pair runs the 32 x 32
micro-kernel over every row pair (the pair's packed W, 64 Kp bytes, then comes from cache, not
memory); C tiles go straight into Y where all 32 columns exist, else through a stack scratch tile for
the N tail. It releases the tiles, then adds the bias and applies the epilogue on its part of Y. With
few row super-blocks (small M) the columns are split into groups so that about ``TARGET_BLOCKS``
blocks exist. The worker returns nothing, so all memory it needs is allocated by the compute (a
failed malloc is an ORT error status).

The driver (``gemm_compute``, ``gemm_worker``) takes the micro-kernel's functions as arguments that
numba binds at compile time (``kernels/amx.py``: the interface): ``OP`` runs it on the AMX tiles,
``EMULATED_OP`` (``OrtfuseGemmActBf16Emulated``, not in ``NATIVE_OPS``: tests add it with
``registration.add_native_op``) on the plain-numba model of the same instructions
(``kernels/amx_emulated.py``), so everything but the tile instructions runs on any x86-64 CPU.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from ortfuse.custom_ops.intrinsics import (
    atomic_cas_i64,
    c_free,
    c_malloc,
    int_to_voidptr,
    load_i64,
    stack_bytes,
    store_i64,
)
from ortfuse.custom_ops.kernels import amx, amx_emulated
from ortfuse.custom_ops.kernels.amx import (
    BLOCK_COLS,
    BLOCK_ROWS,
    CFG_BYTES,
    K_STEP,
    a_row_elems,
    convert_rows,
    pack_weights,
    request_tile_permission,
    round_up,
)
from ortfuse.custom_ops.native.inputs import fail
from ortfuse.custom_ops.native.op_def import AttrDef, NativeOpDef
from ortfuse.custom_ops.native.ops.gemm import (
    CODES_BYTES,
    GA_ACT,
    GEMM_MAX_STEPS,
    GEMM_SCRATCH,
    NATIVE_GEMM_EPILOGUES,
    activation_span,
    gemm_io,
)
from ortfuse.custom_ops.native.slots import slot_api, slot_i64
from ortfuse.custom_ops.native.threads import run_blocks
from ortfuse.custom_ops.native.words import S_OWNED
from ortfuse.custom_ops.status_messages import cstr
from ortfuse.custom_ops.vecmath import always_inline

OP_NAME = "FusedGemmActBf16"
EMULATED_OP_NAME = "OrtfuseGemmActBf16Emulated"
TARGET_BLOCKS = 16          # blocks per call to aim for (enough to balance a few threads)

# packed-weights block: header words, then the data at the next 64-byte boundary
PK_MAGIC, PK_W, PK_K, PK_N, PK_KP, PK_NP, PK_DATA = range(7)
PACK_MAGIC = 0x4F525446414D5831  # "ORTFAMX1"
PACK_HEADER = 64

# args block (int64 words)
(BA_SLOT, BA_X, BA_Y, BA_B, BA_DATA, BA_M, BA_K, BA_N, BA_KP, BA_NP, BA_GROUPS, BA_PPG, BA_CODES, BA_STEPS,
 BA_XBF, BA_LDA, BA_PHASE) = range(17)
ARGS_BYTES = 8 * 18
PHASE_CONVERT, PHASE_GEMM = 0, 1
CONVERT_ROWS = 64           # X rows converted per block (phase 1)
SUPER_ROWS = 128            # rows per GEMM block (phase 2): 4 row pairs share each column pair's W
TAIL_BYTES = BLOCK_ROWS * BLOCK_COLS * 4   # scratch C block for the N tail
LDA_PAD = a_row_elems(0)                    # converted X rows are Kp + LDA_PAD bf16 apart

_T_NO_TILES = cstr("Linux refused the AMX tile-data permission (arch_prctl ARCH_REQ_XCOMP_PERM); "
                   "this op needs a CPU with AMX")
_T_NO_MEMORY = cstr("out of memory for the bf16 packed weights or the per-block scratch")


@njit(cache=True)
def _build_pack(w, k, n):
    """A new packed-weights block for W at address w (K x N), or 0 if malloc fails."""
    kp = round_up(k, K_STEP)
    np_ = round_up(n, BLOCK_COLS)
    raw = c_malloc(PACK_HEADER + 2 * kp * np_ + 64)
    if raw == 0:
        return 0
    data = (raw + PACK_HEADER + 63) // 64 * 64
    store_i64(raw + 8 * PK_MAGIC, PACK_MAGIC)
    store_i64(raw + 8 * PK_W, w)
    store_i64(raw + 8 * PK_K, k)
    store_i64(raw + 8 * PK_N, n)
    store_i64(raw + 8 * PK_KP, kp)
    store_i64(raw + 8 * PK_NP, np_)
    store_i64(raw + 8 * PK_DATA, data)
    pack_weights(w, k, n, kp, np_, data)
    return raw


@njit(cache=True)
def _pack_matches(raw, w, k, n):
    return (load_i64(raw + 8 * PK_MAGIC) == PACK_MAGIC and load_i64(raw + 8 * PK_W) == w
            and load_i64(raw + 8 * PK_K) == k and load_i64(raw + 8 * PK_N) == n)


@njit(cache=True)
def kernel_pack(kernel, w, k, n):
    """(block, temporary) of the packed W: the kernel's own (kept until KernelDestroy), or, when the
    kernel already holds another W's packing, a block for this call that the caller frees. (0, _)
    when out of memory."""
    word = kernel + 8 * S_OWNED
    raw = load_i64(word)
    if raw == 0:
        new = _build_pack(w, k, n)
        if new == 0:
            return 0, False
        raw = atomic_cas_i64(word, 0, new)
        if raw == 0:
            return new, False
        c_free(new)  # a concurrent first compute published its block first
    if _pack_matches(raw, w, k, n):
        return raw, False
    return _build_pack(w, k, n), True


@njit
def gemm_compute(kernel, ctx, request_tiles):
    """The compute of the op: checks, packed W, X buffer, the two ``run_blocks`` phases. Compiled into
    each op's compute (inlined, no cache of its own): ``request_tiles`` is the micro-kernel's."""
    always_inline()
    api = slot_api(kernel)
    dims = stack_bytes(GEMM_SCRATCH)
    st, px, pw, pb, py, m, k, n = gemm_io(api, ctx, kernel, dims)
    if st != 0 or m * n == 0:
        return st
    if load_i64(kernel + 8 * S_OWNED) == 0 and request_tiles() != 0:  # before this kernel's first tile use
        return fail(api, kernel, _T_NO_TILES)
    raw, temporary = kernel_pack(kernel, pw, k, n)
    if raw == 0:
        return fail(api, kernel, _T_NO_MEMORY)
    kp = load_i64(raw + 8 * PK_KP)
    lda = kp + LDA_PAD
    xbuf = c_malloc(2 * m * lda + 64)
    if xbuf == 0:
        if temporary:
            c_free(raw)
        return fail(api, kernel, _T_NO_MEMORY)
    codes = stack_bytes(CODES_BYTES)
    steps = slot_i64(kernel, GA_ACT)
    for s in range(steps):
        store_i64(codes + 8 * s, slot_i64(kernel, GA_ACT + 1 + s))
    np_ = load_i64(raw + 8 * PK_NP)
    supers = (m + SUPER_ROWS - 1) // SUPER_ROWS
    pairs = np_ // BLOCK_COLS
    groups = min(pairs, max(1, (TARGET_BLOCKS + supers - 1) // supers))
    ppg = (pairs + groups - 1) // groups
    groups = (pairs + ppg - 1) // ppg
    args = stack_bytes(ARGS_BYTES)
    store_i64(args + 8 * BA_SLOT, kernel)
    store_i64(args + 8 * BA_X, px)
    store_i64(args + 8 * BA_Y, py)
    store_i64(args + 8 * BA_B, pb)
    store_i64(args + 8 * BA_DATA, load_i64(raw + 8 * PK_DATA))
    store_i64(args + 8 * BA_M, m)
    store_i64(args + 8 * BA_K, k)
    store_i64(args + 8 * BA_N, n)
    store_i64(args + 8 * BA_KP, kp)
    store_i64(args + 8 * BA_NP, np_)
    store_i64(args + 8 * BA_GROUPS, groups)
    store_i64(args + 8 * BA_PPG, ppg)
    store_i64(args + 8 * BA_CODES, codes)
    store_i64(args + 8 * BA_STEPS, steps)
    store_i64(args + 8 * BA_XBF, (xbuf + 63) // 64 * 64)
    store_i64(args + 8 * BA_LDA, lda)
    store_i64(args + 8 * BA_PHASE, PHASE_CONVERT)
    st = run_blocks(api, ctx, kernel, args, (m + CONVERT_ROWS - 1) // CONVERT_ROWS, m * k)
    if st == 0:
        store_i64(args + 8 * BA_PHASE, PHASE_GEMM)
        st = run_blocks(api, ctx, kernel, args, supers * groups, m * n * max(k, 1) // 16)
    c_free(xbuf)
    if temporary:
        c_free(raw)
    return st


@njit(nogil=True, error_model="numpy", cache=True)
def bias_act_rows(y, b, r0, rows, n, c0, c1, codes, steps):
    """y[r, c0:c1] = act(y[r, c0:c1] + b[c0:c1]) for rows [r0, r0 + rows) of the row-major M x N y."""
    bb = b[c0:c1]
    for r in range(r0, r0 + rows):
        yr = y[r * n + c0:r * n + c1]
        for j in range(c1 - c0):
            yr[j] += bb[j]
        if steps > 0:
            activation_span(y, r * n + c0, r * n + c1, codes, steps)


@njit(nogil=True, cache=True)
def copy_tail(src, y_addr, n, r0, rows, c, width):
    """Columns [c, c + width) of rows [r0, r0 + rows) from the 32 x 32 scratch block ``src`` (row
    stride 32 floats) into the row-major M x N y."""
    s = carray(int_to_voidptr(src), (BLOCK_ROWS * BLOCK_COLS,), np.float32)
    for i in range(rows):
        d = carray(int_to_voidptr(y_addr + 4 * ((r0 + i) * n + c)), (width,), np.float32)
        for j in range(width):
            d[j] = s[i * BLOCK_COLS + j]


@njit
def gemm_worker(args, block, configure_tiles, tile_block, release_tiles):
    """One block of either phase (X conversion, GEMM super-block); the micro-kernel's functions are
    bound at compile time. Compiled into each op's worker (inlined, no cache of its own)."""
    always_inline()
    m = load_i64(args + 8 * BA_M)
    k = load_i64(args + 8 * BA_K)
    kp = load_i64(args + 8 * BA_KP)
    lda = load_i64(args + 8 * BA_LDA)
    xbf = load_i64(args + 8 * BA_XBF)
    if load_i64(args + 8 * BA_PHASE) == PHASE_CONVERT:
        r0 = block * CONVERT_ROWS
        convert_rows(load_i64(args + 8 * BA_X), k, r0, min(CONVERT_ROWS, m - r0), kp, lda, xbf + 2 * r0 * lda)
        return
    n = load_i64(args + 8 * BA_N)
    groups = load_i64(args + 8 * BA_GROUPS)
    ppg = load_i64(args + 8 * BA_PPG)
    data = load_i64(args + 8 * BA_DATA)
    py = load_i64(args + 8 * BA_Y)
    r0 = (block // groups) * SUPER_ROWS
    rows = min(SUPER_ROWS, m - r0)
    p0 = (block % groups) * ppg
    p1 = min(load_i64(args + 8 * BA_NP) // BLOCK_COLS, p0 + ppg)
    tail = stack_bytes(TAIL_BYTES)
    cfg = stack_bytes(CFG_BYTES)
    configured = 0
    for p in range(p0, p1):  # a column pair's packed W (64 Kp bytes) serves every row pair from cache
        c = p * BLOCK_COLS
        b0 = data + 2 * p * kp * 32
        for r in range(r0, r0 + rows, BLOCK_ROWS):
            here = min(BLOCK_ROWS, r0 + rows - r)
            if here != configured:  # tile rows = the rows there are: the last row pair may have fewer
                configure_tiles(cfg, here)
                configured = here
            a = xbf + 2 * r * lda
            if c + BLOCK_COLS <= n:
                tile_block(a, 2 * lda, kp, here, b0, b0 + kp * 32, py + 4 * (r * n + c), 4 * n)
            else:
                tile_block(a, 2 * lda, kp, here, b0, b0 + kp * 32, tail, 4 * BLOCK_COLS)
                copy_tail(tail, py, n, r, here, c, n - c)
    release_tiles()
    y = carray(int_to_voidptr(py), (m * n,), np.float32)
    b = carray(int_to_voidptr(load_i64(args + 8 * BA_B)), (n,), np.float32)
    codes = carray(int_to_voidptr(load_i64(args + 8 * BA_CODES)), (GEMM_MAX_STEPS,), np.int64)
    bias_act_rows(y, b, r0, rows, n, p0 * BLOCK_COLS, min(n, p1 * BLOCK_COLS), codes, load_i64(args + 8 * BA_STEPS))


def unavailable_reason() -> str | None:
    """Why ``FusedGemmActBf16`` cannot run in this process, or None when it can: the host CPU (not an
    ``ORTFUSE_ISA`` override) must report amx-tile and amx-bf16, the native path must be available,
    and Linux must grant the tile-data permission (asked here, once per process)."""
    from ortfuse.custom_ops.native import availability
    from ortfuse.foundation import isa

    missing = sorted({"amx-tile", "amx-bf16"} - isa.host_features())
    if missing:
        return f"this CPU does not report {', '.join(missing)}"
    return availability.unavailable_reason() or request_tile_permission()


def _compute_gemm_bf16(kernel, ctx):
    return gemm_compute(kernel, ctx, amx.request_tiles)


def _gemm_bf16_worker(args, block):
    gemm_worker(args, block, amx.configure_tiles, amx.tile_block, amx.release_tiles)


def _compute_gemm_bf16_emulated(kernel, ctx):
    return gemm_compute(kernel, ctx, amx_emulated.request_tiles)


def _gemm_bf16_emulated_worker(args, block):
    gemm_worker(args, block, amx_emulated.configure_tiles, amx_emulated.tile_block, amx_emulated.release_tiles)


def _op(name, compute, worker, min_level="generic") -> NativeOpDef:
    return NativeOpDef(name, ("X", "W", "B"), compute, worker,
                       attrs=(AttrDef("activation", "choice", GA_ACT, required=False, choices=NATIVE_GEMM_EPILOGUES,
                                      max_steps=GEMM_MAX_STEPS),), min_level=min_level)


OP = _op(OP_NAME, _compute_gemm_bf16, _gemm_bf16_worker, min_level="avx512")  # every AMX CPU has AVX-512
EMULATED_OP = _op(EMULATED_OP_NAME, _compute_gemm_bf16_emulated, _gemm_bf16_emulated_worker)
NATIVE_OPS = (OP,)  # the family's ops (registration discovers this module)
