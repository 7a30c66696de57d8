"""Elementwise numba kernels: fused elementwise ops and the activation epilogues of GEMM / Conv.

Caller contract (the ORT ABI layer calls these from numba cfuncs):

- Tensors are **contiguous 1-D float32 arrays** (``float32[::1]``: a ``carray`` over the ORT buffer, or
  ``x.reshape(-1)`` of a C-contiguous numpy array). Kernels never see strides; a caller holding a
  non-contiguous numpy array makes it contiguous first (``flat_f32``), as ``run`` does.
- The output array is passed in and may be the input (in place). Nothing is allocated.
- Each kernel returns an int64 status: ``OK`` (0) or ``ERR_SIZE`` (-1) when the sizes do not fit
  (then nothing is written). Zero-size tensors are fine.
- Scalar parameters are float32 (pass ``np.float32`` values, or anything numba converts: the kernels
  cast them), activation codes are int64 (``encode_activation``).
- All kernels are ``@njit(nogil=True, error_model="numpy", cache=True)`` (numpy error model: a float
  division by zero gives ±Inf/NaN like the reference, and no per-division check blocks vectorising).
- From ``parallel_min`` elements on, the work is split into blocks of ``BLOCK`` elements over numba's
  threads (prange); below it runs serially in the calling thread. The default ``PARALLEL_MIN`` is
  ``SERIAL`` (never parallel): a parallel call stalls whenever the other cores are busy (see
  PARALLEL_MIN below); ``PARALLEL_MIN_IDLE`` is the crossover when they are idle; 0 forces the
  parallel path. Inside a cfunc the parallel path needs numba's OpenMP
  or TBB threading layer (docs/ARCHITECTURE.md §6: ``workqueue`` aborts on concurrent use), which
  ``numba_setup.configure_numba()`` selects; call it before these kernels.
- numba's cache does not notice edits of ``custom_ops/vecmath.py``: the kernels here inline its
  functions, so after changing vecmath delete this folder's ``__pycache__/*.nbi``/``*.nbc`` (or the
  ``NUMBA_CACHE_DIR``), or the kernels keep the old math.

Numerics match ``custom_ops/reference.py``:

- relu, clip, hardsigmoid, hardswish, add_relu and bias adds use the same float32 operations in the
  same order as the reference (no FMA contraction): results are bit-identical, including NaN (relu and
  clip of NaN are NaN, a NaN bound makes the result NaN), ±Inf and ±0 (numpy's maximum/minimum
  return the second operand on ties, so relu(-0) = +0 and clip(-0, 0, hi) = +0).
- gelu, gelu_tanh, silu, sigmoid use ``custom_ops.vecmath`` (erf/tanh/exp within 1-3 ulp) instead of
  libm; the formulas are the reference's, in its order, so differences are a few ulp of the
  transcendental part (see tests/test_eltwise_kernels.py for the bounds). Two deliberate
  differences: gelu scales by float32(1/sqrt 2) (a multiply, like ORT's Gelu kernel) where the
  reference divides by float32(sqrt 2); sigmoid keeps subnormal results for x < -87.3 where
  the reference's float32 1/(1+exp(-x)) flushes to 0; silu is x / (1 + e**-x) (vecmath.silu_f32),
  -0 from x < -88.38 on (the reference still gives tiny values there down to -88.72, all above -3.7e-37).

No fastmath flags are used: nothing here needs reassociation to vectorise (no reductions), and the
flags that would help (nnan, ninf, nsz) would break the NaN/Inf/-0 semantics above. FMA is used only
inside vecmath, explicitly, through ``llvm.fmuladd``.

API (all return int64 status):

    relu(x, out, parallel_min=PARALLEL_MIN)
    sigmoid(x, out, ...), silu(x, out, ...), gelu(x, out, ...), gelu_tanh(x, out, ...)
    tanh(x, out, ...), exp(x, out, ...), erf(x, out, ...)
    clip(x, out, lo, hi, ...)
    hardsigmoid(x, out, alpha, beta, ...)            clip(alpha x + beta, 0, 1)
    hardswish(x, out, add, lo, hi, div, ...)          x * (clip(x + add, lo, hi) / div)   (FusedHardSwish)
    add_relu(a, b, out, ...)                          relu(a + b), equal sizes
    add_relu_bcast(a, b, out, ...)                    relu(a + b) with b of size N repeated along a
    activation(x, out, code, alpha, beta, ...)        reference.activation(x, kind, alpha, beta)
    bias_act(x, b, out, code, alpha, beta, ...)       act(x + b) over rows of [M, N], b of size N
                                                      (size 0: no bias); the GEMM/Conv epilogue
    apply_op(x, out, op, p0, p1, p2, p3, ...)         one ACT_* code with up to four parameters

``code`` packs up to ``MAX_CHAIN`` steps of ``reference.activation``'s '+' chains, 4 bits per step,
first step lowest: ``encode_activation("relu+gelu")``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ortfuse.custom_ops.kernels.scalar import (
    clip1,
    gelu1,
    gelu_tanh1,
    hardsigmoid1,
    relu1,
)
from ortfuse.custom_ops.vecmath import (
    erf_f32,
    exp_f32,
    prefer_512bit,
    sigmoid_f32,
    silu_f32,
    tanh_f32,
)

F32 = np.float32

# Callers run ``numba_setup.configure_numba()`` before calling these kernels: it also starts numba's
# thread pool, which a cached caller of the parallel kernels here needs (see ``launch_thread_pool``).

OK = 0
ERR_SIZE = -1

# Parallel threshold (elements): serial by default for every size. On a machine whose other cores are
# busy (another process, or ORT's intra-op threads spinning after a run) a woken OpenMP thread waits
# for a scheduler tick, a stall far longer than a small kernel; a caller that knows a core is free
# passes ``parallel_min=PARALLEL_MIN_IDLE``, the crossover with idle cores. Measure both on a machine
# with ``python tools/kernel_bench.py --threshold``.
SERIAL = 1 << 62
PARALLEL_MIN = SERIAL
PARALLEL_MIN_IDLE = 1 << 18
BLOCK = 1 << 15         # elements per parallel work item (128 KiB of float32)
CHUNK = 2048            # elements per pass of a multi-step chain (8 KiB: stays in L1)

# activation codes: one elementwise step of an epilogue (4 bits each in a packed activation chain).
# ACT_*, not OP_*: the chain kernel's step codes (native.ops.eltwise_chain.encoding.OP_*) are another
# table, the index of an op in reference.ELTWISE_OPS
ACT_NONE = 0
ACT_RELU = 1
ACT_GELU = 2
ACT_GELU_TANH = 3
ACT_CLIP = 4             # p0 = min, p1 = max
ACT_HARDSIGMOID = 5      # p0 = alpha, p1 = beta
ACT_HARDSWISH = 6        # x * hardsigmoid(x; p0 = alpha, p1 = beta)   (reference.activation)
ACT_SILU = 7
ACT_SIGMOID = 8
ACT_TANH = 9
ACT_EXP = 10
ACT_ERF = 11
ACT_HARDSWISH4 = 12      # x * (clip(x + p0, p1, p2) / p3)            (reference.hardswish)
N_ACTS = 13

ACTIVATION_CODES = {"": ACT_NONE, "relu": ACT_RELU, "gelu": ACT_GELU, "gelu_tanh": ACT_GELU_TANH,
                    "clip": ACT_CLIP, "hardsigmoid": ACT_HARDSIGMOID, "hardswish": ACT_HARDSWISH,
                    "silu": ACT_SILU}
MAX_CHAIN = 4



def encode_activation(kind: str) -> int:
    """The int64 code of a ``reference.activation`` kind ('' | relu | gelu | gelu_tanh | clip |
    hardsigmoid | hardswish | silu, '+' chains them, at most MAX_CHAIN steps)."""
    steps = [s for s in kind.split("+") if s]
    if len(steps) > MAX_CHAIN:
        raise ValueError(f"activation chain {kind!r} has more than {MAX_CHAIN} steps")
    code = 0
    for i, step in enumerate(steps):
        if step not in ACTIVATION_CODES:
            raise ValueError(f"unknown activation {step!r}; known: {sorted(k for k in ACTIVATION_CODES if k)}")
        code |= ACTIVATION_CODES[step] << (4 * i)
    return code


def decode_activation(code: int) -> str:
    names = {v: k for k, v in ACTIVATION_CODES.items()}
    steps = []
    while code:
        steps.append(names[code & 15])
        code >>= 4
    return "+".join(steps)


# ---------------------------------------------------------------------------------------------
# serial range loops
# ---------------------------------------------------------------------------------------------

@intrinsic
def _same(typingctx, a, b):
    """Whether two arrays start at the same address (in place: see ``_loops_ip``). (``a.ctypes.data``
    would say the same but makes numba refuse to cache the kernel.)"""
    if not (isinstance(a, types.Array) and isinstance(b, types.Array)):
        return None

    def codegen(context, builder, sig, args):
        pa = context.make_array(sig.args[0])(context, builder, value=args[0]).data
        pb = context.make_array(sig.args[1])(context, builder, value=args[1]).data
        ia = builder.ptrtoint(pa, ir.IntType(64))
        ib = builder.ptrtoint(pb, ir.IntType(64))
        return builder.icmp_unsigned("==", ia, ib)
    return types.boolean(a, b), codegen


@njit(nogil=True, error_model="numpy", cache=True)
def _loops(s, d, op, p0, p1, p2, p3):
    """d = op(s) over two distinct equal-size arrays: one vectorised loop per op, the switch
    outside the loops."""
    n = d.size
    if op == ACT_RELU:
        for i in range(n):
            d[i] = relu1(s[i])
    elif op == ACT_GELU:
        prefer_512bit()
        for i in range(n):
            d[i] = gelu1(s[i])
    elif op == ACT_GELU_TANH:
        prefer_512bit()
        for i in range(n):
            d[i] = gelu_tanh1(s[i])
    elif op == ACT_CLIP:
        for i in range(n):
            d[i] = clip1(s[i], p0, p1)
    elif op == ACT_HARDSIGMOID:
        for i in range(n):
            d[i] = hardsigmoid1(s[i], p0, p1)
    elif op == ACT_HARDSWISH:
        for i in range(n):
            v = s[i]
            d[i] = v * hardsigmoid1(v, p0, p1)
    elif op == ACT_SILU:
        prefer_512bit()
        for i in range(n):
            d[i] = silu_f32(s[i])
    elif op == ACT_SIGMOID:
        prefer_512bit()
        for i in range(n):
            d[i] = sigmoid_f32(s[i])
    elif op == ACT_TANH:
        prefer_512bit()
        for i in range(n):
            d[i] = tanh_f32(s[i])
    elif op == ACT_EXP:
        prefer_512bit()
        for i in range(n):
            d[i] = exp_f32(s[i])
    elif op == ACT_ERF:
        prefer_512bit()
        for i in range(n):
            d[i] = erf_f32(s[i])
    elif op == ACT_HARDSWISH4:
        for i in range(n):
            v = s[i]
            d[i] = v * (clip1(v + p0, p1, p2) / p3)
    else:  # ACT_NONE (unknown codes are rejected by the public functions): copy
        for i in range(n):
            d[i] = s[i]


@njit(nogil=True, error_model="numpy", cache=True)
def _loops_ip(d, op, p0, p1, p2, p3):
    """d = op(d) in place. Its own loops, not ``_loops(d, d)``: LLVM vectorises ``_loops`` when it
    compiles it, behind a run-time check that s and d do not overlap at all, and an in-place call
    fails that check and runs the scalar fallback (``python tools/kernel_bench.py --dispatcher`` times
    both; tests/test_eltwise_kernels.py checks these loops are vector code)."""
    n = d.size
    if op == ACT_RELU:
        for i in range(n):
            d[i] = relu1(d[i])
    elif op == ACT_GELU:
        prefer_512bit()
        for i in range(n):
            d[i] = gelu1(d[i])
    elif op == ACT_GELU_TANH:
        prefer_512bit()
        for i in range(n):
            d[i] = gelu_tanh1(d[i])
    elif op == ACT_CLIP:
        for i in range(n):
            d[i] = clip1(d[i], p0, p1)
    elif op == ACT_HARDSIGMOID:
        for i in range(n):
            d[i] = hardsigmoid1(d[i], p0, p1)
    elif op == ACT_HARDSWISH:
        for i in range(n):
            v = d[i]
            d[i] = v * hardsigmoid1(v, p0, p1)
    elif op == ACT_SILU:
        prefer_512bit()
        for i in range(n):
            d[i] = silu_f32(d[i])
    elif op == ACT_SIGMOID:
        prefer_512bit()
        for i in range(n):
            d[i] = sigmoid_f32(d[i])
    elif op == ACT_TANH:
        prefer_512bit()
        for i in range(n):
            d[i] = tanh_f32(d[i])
    elif op == ACT_EXP:
        prefer_512bit()
        for i in range(n):
            d[i] = exp_f32(d[i])
    elif op == ACT_ERF:
        prefer_512bit()
        for i in range(n):
            d[i] = erf_f32(d[i])
    elif op == ACT_HARDSWISH4:
        for i in range(n):
            v = d[i]
            d[i] = v * (clip1(v + p0, p1, p2) / p3)


@njit(nogil=True, error_model="numpy", cache=True)
def _apply_range(src, dst, lo, hi, op, p0, p1, p2, p3):
    """dst[lo:hi] = op(src[lo:hi]). With a literal ``op`` numba prunes the other ops' branches (a
    kernel compiles only its own math)."""
    s = src[lo:hi]
    d = dst[lo:hi]
    if _same(s, d):
        _loops_ip(d, op, p0, p1, p2, p3)
    else:
        _loops(s, d, op, p0, p1, p2, p3)


@njit(nogil=True, error_model="numpy", cache=True)
def _chain_range(src, b, dst, lo, hi, code, p0, p1, p2, p3):
    """dst[i] = steps of ``code`` applied to src[i] (+ b[i % N] first if N = b.size > 0), for i in
    [lo, hi). Works in segments of at most CHUNK elements that do not cross a row of b: the first step
    (or the bias add) reads src, the later steps work in place on a segment still in L1, so memory is
    read and written once whatever the chain length."""
    nb = b.size
    i = lo
    while i < hi:
        if nb == 0:
            seg = min(hi - i, CHUNK)
            _apply_range(src, dst, i, i + seg, code & 15, p0, p1, p2, p3)
            rest = code >> 4
        else:
            j = i % nb
            seg = min(hi - i, nb - j, CHUNK)
            s = src[i:i + seg]
            d = dst[i:i + seg]
            bb = b[j:j + seg]
            if _same(s, d):
                for k in range(seg):
                    d[k] += bb[k]
            else:
                for k in range(seg):
                    d[k] = s[k] + bb[k]
            rest = code
        while rest != 0:
            _apply_range(dst, dst, i, i + seg, rest & 15, p0, p1, p2, p3)
            rest >>= 4
        i += seg


@njit(nogil=True, error_model="numpy", cache=True)
def _add_relu_seg(x, y, d):
    """d = relu(x + y) over equal-size segments; in place (d is x or y) with one input array."""
    if _same(d, x):
        for k in range(d.size):
            d[k] = relu1(d[k] + y[k])
    elif _same(d, y):
        for k in range(d.size):
            d[k] = relu1(x[k] + d[k])
    else:
        for k in range(d.size):
            d[k] = relu1(x[k] + y[k])


@njit(nogil=True, error_model="numpy", cache=True)
def _add_relu_range(a, b, dst, lo, hi):
    """dst[i] = relu(a[i] + b[i % N]), N = b.size (N == a.size: plain elementwise)."""
    nb = b.size
    if nb == a.size:
        _add_relu_seg(a[lo:hi], b[lo:hi], dst[lo:hi])
        return
    i = lo
    while i < hi:
        j = i % nb
        seg = min(hi - i, nb - j)
        _add_relu_seg(a[i:i + seg], b[j:j + seg], dst[i:i + seg])
        i += seg


# ---------------------------------------------------------------------------------------------
# parallel drivers: prange over blocks of BLOCK elements
# ---------------------------------------------------------------------------------------------

@njit(nogil=True, error_model="numpy", cache=True, parallel=True)
def _op_par(src, dst, n, op, p0, p1, p2, p3):
    """One op over blocks. ``op`` arrives as a literal from the public kernels: numba specialises on it
    and prunes the other ops' loops, so each kernel compiles only its own math."""
    nblocks = (n + BLOCK - 1) // BLOCK
    for blk in prange(nblocks):
        lo = blk * BLOCK
        _apply_range(src, dst, lo, min(lo + BLOCK, n), op, p0, p1, p2, p3)


@njit(nogil=True, error_model="numpy", cache=True, parallel=True)
def _chain_par(src, b, dst, n, code, p0, p1, p2, p3):
    nblocks = (n + BLOCK - 1) // BLOCK
    for blk in prange(nblocks):
        lo = blk * BLOCK
        _chain_range(src, b, dst, lo, min(lo + BLOCK, n), code, p0, p1, p2, p3)


@njit(nogil=True, error_model="numpy", cache=True, parallel=True)
def _add_relu_par(a, b, dst, n):
    nblocks = (n + BLOCK - 1) // BLOCK
    for blk in prange(nblocks):
        lo = blk * BLOCK
        _add_relu_range(a, b, dst, lo, min(lo + BLOCK, n))


# ---------------------------------------------------------------------------------------------
# public kernels
# ---------------------------------------------------------------------------------------------

@njit(nogil=True, error_model="numpy", cache=True)
def _valid_code(code):
    if code < 0:
        return False
    rest = code
    while rest != 0:
        if (rest & 15) >= N_ACTS:
            return False
        rest >>= 4
    return True


@njit(nogil=True, error_model="numpy", cache=True)
def _unary1(x, out, op, p0, p1, p2, p3, parallel_min):
    """One op: ``op`` is a literal (a global ACT_* constant at the call site)."""
    n = x.size
    if out.size != n:
        return ERR_SIZE
    a, b, c, d = F32(p0), F32(p1), F32(p2), F32(p3)
    if n >= parallel_min and n > BLOCK:
        _op_par(x, out, n, op, a, b, c, d)
    else:
        _apply_range(x, out, n - n, n, op, a, b, c, d)
    return OK


@njit(nogil=True, error_model="numpy", cache=True)
def _chain(x, b, out, code, p0, p1, p2, p3, parallel_min):
    """A packed chain of ops known at run time (all ops' loops compiled in, once), after a bias add
    along the last dim when b is not empty."""
    n = x.size
    nb = b.size
    code = code + 0  # a run-time value: one compiled chain kernel for every code
    if out.size != n or not _valid_code(code) or (nb != 0 and n % nb != 0):
        return ERR_SIZE
    a, c, d, e = F32(p0), F32(p1), F32(p2), F32(p3)
    if n >= parallel_min and n > BLOCK:
        _chain_par(x, b, out, n, code, a, c, d, e)
    else:
        _chain_range(x, b, out, n - n, n, code, a, c, d, e)
    return OK


@njit(nogil=True, error_model="numpy", cache=True)
def _unary(x, out, code, p0, p1, p2, p3, parallel_min):
    return _chain(x, x[:0], out, code, p0, p1, p2, p3, parallel_min)


@njit(nogil=True, error_model="numpy", cache=True)
def apply_op(x, out, op, p0, p1, p2, p3, parallel_min=PARALLEL_MIN):
    """out = op(x) for one ACT_* code (or a packed chain of them) with parameters p0..p3."""
    return _unary(x, out, op, p0, p1, p2, p3, parallel_min)


@njit(nogil=True, error_model="numpy", cache=True)
def relu(x, out, parallel_min=PARALLEL_MIN):
    return _unary1(x, out, ACT_RELU, 0.0, 0.0, 0.0, 0.0, parallel_min + 0)


@njit(nogil=True, error_model="numpy", cache=True)
def gelu(x, out, parallel_min=PARALLEL_MIN):
    return _unary1(x, out, ACT_GELU, 0.0, 0.0, 0.0, 0.0, parallel_min + 0)


@njit(nogil=True, error_model="numpy", cache=True)
def gelu_tanh(x, out, parallel_min=PARALLEL_MIN):
    return _unary1(x, out, ACT_GELU_TANH, 0.0, 0.0, 0.0, 0.0, parallel_min + 0)


@njit(nogil=True, error_model="numpy", cache=True)
def silu(x, out, parallel_min=PARALLEL_MIN):
    return _unary1(x, out, ACT_SILU, 0.0, 0.0, 0.0, 0.0, parallel_min + 0)


@njit(nogil=True, error_model="numpy", cache=True)
def sigmoid(x, out, parallel_min=PARALLEL_MIN):
    return _unary1(x, out, ACT_SIGMOID, 0.0, 0.0, 0.0, 0.0, parallel_min + 0)


@njit(nogil=True, error_model="numpy", cache=True)
def tanh(x, out, parallel_min=PARALLEL_MIN):
    return _unary1(x, out, ACT_TANH, 0.0, 0.0, 0.0, 0.0, parallel_min + 0)


@njit(nogil=True, error_model="numpy", cache=True)
def exp(x, out, parallel_min=PARALLEL_MIN):
    return _unary1(x, out, ACT_EXP, 0.0, 0.0, 0.0, 0.0, parallel_min + 0)


@njit(nogil=True, error_model="numpy", cache=True)
def erf(x, out, parallel_min=PARALLEL_MIN):
    return _unary1(x, out, ACT_ERF, 0.0, 0.0, 0.0, 0.0, parallel_min + 0)


@njit(nogil=True, error_model="numpy", cache=True)
def clip(x, out, lo, hi, parallel_min=PARALLEL_MIN):
    return _unary1(x, out, ACT_CLIP, lo, hi, 0.0, 0.0, parallel_min + 0)


@njit(nogil=True, error_model="numpy", cache=True)
def hardsigmoid(x, out, alpha, beta, parallel_min=PARALLEL_MIN):
    return _unary1(x, out, ACT_HARDSIGMOID, alpha, beta, 0.0, 0.0, parallel_min + 0)


@njit(nogil=True, error_model="numpy", cache=True)
def hardswish(x, out, add, lo, hi, div, parallel_min=PARALLEL_MIN):
    """x * (clip(x + add, lo, hi) / div): FusedHardSwish (Add->Clip->Div->Mul; HardSwish is 3, 0, 6, 6)."""
    return _unary1(x, out, ACT_HARDSWISH4, add, lo, hi, div, parallel_min + 0)


@njit(nogil=True, error_model="numpy", cache=True)
def activation(x, out, code, alpha, beta, parallel_min=PARALLEL_MIN):
    """out = reference.activation(x, kind, alpha, beta) with code = encode_activation(kind)."""
    return _unary(x, out, code, alpha, beta, 0.0, 0.0, parallel_min + 0)


@njit(nogil=True, error_model="numpy", cache=True)
def add_relu(a, b, out, parallel_min=PARALLEL_MIN):
    """out = relu(a + b), all three of one size."""
    n = a.size
    if b.size != n or out.size != n:
        return ERR_SIZE
    if n >= parallel_min and n > BLOCK:
        _add_relu_par(a, b, out, n)
    else:
        _add_relu_range(a, b, out, 0, n)
    return OK


@njit(nogil=True, error_model="numpy", cache=True)
def add_relu_bcast(a, b, out, parallel_min=PARALLEL_MIN):
    """out = relu(a + b) where a is [M, N] flat and b has N elements (broadcast along the last dim)."""
    n = a.size
    nb = b.size
    if out.size != n or (nb == 0 and n != 0) or (nb != 0 and n % nb != 0):
        return ERR_SIZE
    if n == 0:
        return OK
    if n >= parallel_min and n > BLOCK:
        _add_relu_par(a, b, out, n)
    else:
        _add_relu_range(a, b, out, 0, n)
    return OK


@njit(nogil=True, error_model="numpy", cache=True)
def bias_act(x, b, out, code, alpha, beta, parallel_min=PARALLEL_MIN):
    """out[i, j] = act(x[i, j] + b[j]) over x = [M, N] flat, b of size N (size 0: no bias).
    out may be x (in place: the GEMM epilogue)."""
    return _chain(x, b, out, code, alpha, beta, 0.0, 0.0, parallel_min + 0)


# ---------------------------------------------------------------------------------------------
# Python-level conveniences (tests, tools; not for cfuncs)
# ---------------------------------------------------------------------------------------------

UNARY_KERNELS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu, "sigmoid": sigmoid,
                 "tanh": tanh, "exp": exp, "erf": erf}
PARAM_KERNELS = {"clip": (clip, ("lo", "hi")), "hardsigmoid": (hardsigmoid, ("alpha", "beta")),
                 "hardswish": (hardswish, ("add", "lo", "hi", "div"))}


def flat_f32(a) -> np.ndarray:
    """A contiguous 1-D float32 view of ``a`` if it already is one, else a contiguous copy."""
    return np.ascontiguousarray(a, dtype=np.float32).reshape(-1)


def run(name: str, *inputs, out=None, parallel_min: int = PARALLEL_MIN, **params) -> np.ndarray:
    """Run kernel ``name`` on numpy arrays of any layout and return an array of the first input's
    shape: inputs are made contiguous float32 (copied when strided), ``out`` is allocated if None.
    ``activation`` / ``bias_act`` take ``kind=`` (a reference.activation string) and alpha, beta."""
    flats = [flat_f32(a) for a in inputs]
    shape = np.shape(inputs[0])
    res = np.empty(flats[0].size, dtype=np.float32) if out is None else out.reshape(-1)
    if name in UNARY_KERNELS:
        status = UNARY_KERNELS[name](flats[0], res, parallel_min)
    elif name in PARAM_KERNELS:
        fn, keys = PARAM_KERNELS[name]
        status = fn(flats[0], res, *(F32(params[k]) for k in keys), parallel_min)
    elif name in ("add_relu", "add_relu_bcast"):
        status = (add_relu if name == "add_relu" else add_relu_bcast)(flats[0], flats[1], res, parallel_min)
    elif name == "activation":
        status = activation(flats[0], res, encode_activation(params.get("kind", "")),
                            F32(params.get("alpha", 0.0)), F32(params.get("beta", 0.0)), parallel_min)
    elif name == "bias_act":
        status = bias_act(flats[0], flats[1], res, encode_activation(params.get("kind", "")),
                          F32(params.get("alpha", 0.0)), F32(params.get("beta", 0.0)), parallel_min)
    else:
        raise KeyError(f"unknown kernel {name!r}")
    if status != OK:
        raise ValueError(f"kernel {name} rejected the sizes {[a.size for a in flats]} -> {res.size}")
    return res.reshape(shape)
