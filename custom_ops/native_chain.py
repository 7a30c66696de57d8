"""Native kernel of ``FusedEltwiseChain{k}``: the steps of an elementwise program applied to X (with
operands C0..C{k-1}) in one pass over memory.

Encoding. When the rewriter picks this kernel it adds, beside ``program`` (JSON, kept for the
reference path and for readers) and the provenance attributes, three attributes made by
``node_attrs`` and read once in CreateKernelV2:

* ``chain_ops`` (ints), one per step: the index of the step's op in ``CHAIN_OPS``;
* ``chain_args`` (ints), one per step: -1 for a unary op, ``2 k`` for ``op(x, Ck)``, ``2 k + 1``
  for ``op(Ck, x)``;
* ``chain_params`` (floats), two per step: LeakyRelu (alpha, 0), Clip (min, max), HardSigmoid
  (alpha, beta), else (0, 0).

A program longer than ``MAX_STEPS`` (or with a step the kernel lacks, such as ``x op x``) is
refused by ``node_attrs``; the registry then picks the reference kernel for that match.

Shapes. The output is the numpy broadcast of X and of every operand a step uses: elementwise steps
commute with broadcasting, so each output element is the program applied to the elements broadcast
to it, and this is the shape the reference and ORT's unfused ops give. The running shape is
broadcast with each operand in step order; the first pair that does not broadcast fails the run with
``ORT_FAIL`` (the class stock ORT's Add/Mul/Pow/Max... raise) and names both shapes. Operands no
step uses are not read.

Walk. The broadcast is collapsed into dims where each input either follows the output (stride) or
repeats (stride 0). The output is cut into blocks of ``BLOCK`` elements (``native.run_blocks``:
serial, ORT's pool or numba's) and each block into chunks of at most ``CHUNK`` elements (L1): the
first step reads X (and its operand) and writes the output chunk, then every later step runs in
place on it, so X and the output pass through memory once whatever the chain length, and a chain
of s steps makes s passes over the chunk, as s single ops would make over their tensors. The first
polynomial step of a chunk hints the next chunk of its block into the cache while it computes
(``prefetch_ahead``; tensors of at least ``native_ops.HINT_MIN`` elements), so that memory stays busy
during the math. Unary
Sigmoid/Tanh/Exp/Erf/Softplus as the first step copy X into the chunk first (their math dwarfs that
pass). In a chunk each input is a slice of its buffer, one repeated element, or (innermost dim
shorter than ``ROW_MIN`` and the input neither follows nor repeats over the chunk) its elements
gathered into a stack buffer. Chunks never cross a row when the innermost dim has at least
``ROW_MIN`` elements, so then nothing is gathered.

Math, float32 (``error_model="numpy"``: x/0 is +-Inf or NaN): Relu, LeakyRelu, Clip, HardSigmoid,
Abs, Neg, Floor, Ceil, Sqrt, Reciprocal, Add, Sub, Mul, Div, Max, Min use the reference's float32
operations (NaN propagates through Max/Min/Clip like numpy and ORT); Sigmoid, Tanh, Exp, Erf use
``vecmath`` (within ``vecmath.MAX_ULP``), in 512-bit vectors where the target has them; Log, Pow and
Softplus's log1p are libm calls (scalar), and Pow by a repeated exponent 2 or 3 is x*x or x*x*x, as
ORT computes it. One loop per step and op over the chunk (the op switch outside the loop). The
cheap ops' loops are vectorised inside ``_unary_loop``/``_binary_loop`` and keep LLVM's 256-bit
vectors: with ``prefer_512bit`` there, a 3-step chain on 32M floats, whose first step streams X
from memory, took 1.45x as long (64K floats: no clear change). ``prefer_512bit`` on
``unary_step``/``binary_step`` leaves those loops 256-bit but halved the worker's machine code
(13.5K against 25.5K lines of assembly), with the same speed.
"""

from __future__ import annotations

import json
import math

import numpy as np
from numba import carray, njit
from ortfuse.custom_ops.abi import (
    cstr,
    int_to_voidptr,
    load_f64,
    load_i64,
    prefetch_lines,
    stack_bytes,
    store_f64,
    store_i64,
)
from ortfuse.custom_ops.kernels.eltwise import (
    _clip1,
    _hardsigmoid1,
    _max1,
    _min1,
    _relu1,
)
from ortfuse.custom_ops.native import (
    ATTR_BASE,
    DIMS_BYTES,
    EXT,
    EXT_N_INPUTS,
    MAX_RANK,
    S_RECORD,
    AttrDef,
    NativeOpDef,
    check_input_count,
    element_count,
    fail,
    make_output,
    read_float_input,
    run_blocks,
    slot_api,
    slot_i64,
)
from ortfuse.custom_ops.native_ops import HINT_MIN, NATIVE_OPS, broadcast_dims, broadcast_error
from ortfuse.custom_ops.reference import ELTWISE_OPS
from ortfuse.custom_ops.specs import MAX_CHAIN_OPERANDS
from ortfuse.custom_ops.vecmath import (
    always_inline,
    erf_f32,
    exp_f32,
    prefer_512bit,
    sigmoid_f32,
    tanh_f32,
)

CHAIN_OPS = ELTWISE_OPS  # unary first (codes < N_UNARY), then binary
(OP_RELU, OP_SIGMOID, OP_TANH, OP_EXP, OP_LOG, OP_ABS, OP_NEG, OP_SQRT, OP_RECIPROCAL, OP_ERF, OP_FLOOR,
 OP_CEIL, OP_SOFTPLUS, OP_LEAKYRELU, OP_CLIP, OP_HARDSIGMOID,
 OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_POW, OP_MAX, OP_MIN) = range(len(CHAIN_OPS))
N_UNARY = OP_ADD
_MATH_OPS = (OP_SIGMOID, OP_TANH, OP_EXP, OP_ERF, OP_SOFTPLUS)  # polynomial: their own loops, in 512-bit vectors
N_OPS = len(CHAIN_OPS)
MAX_STEPS = 12
MAX_INPUTS = 1 + MAX_CHAIN_OPERANDS

# attribute words of the kernel state: each list is its count, then its values
W_OPS, W_ARGS, W_PARAMS = 0, 1 + MAX_STEPS, 2 + 2 * MAX_STEPS
CHAIN_ATTRS = (AttrDef("chain_ops", "ints", W_OPS, max_steps=MAX_STEPS),
               AttrDef("chain_args", "ints", W_ARGS, max_steps=MAX_STEPS),
               AttrDef("chain_params", "floats", W_PARAMS, max_steps=2 * MAX_STEPS))

BLOCK = 1 << 14     # output elements per block (the unit handed to a thread)
CHUNK = 1024        # output elements per chunk: all steps run on it while it is in L1 (X, output and
                    # an operand: 12K of 48K); at 64K/32M floats 2048 was as fast or slower, 8192 slower
ROW_MIN = 512       # innermost dims this long are walked row by row (no gathering)
PIECE = 256         # a polynomial step runs in pieces this long, each after hinting one piece of the next chunk

# collapsed broadcast plan: MAX_RANK records (extent, stride of input 0..MAX_INPUTS-1), innermost first
PLAN_REC = 1 + MAX_INPUTS
PLAN_BYTES = 8 * PLAN_REC * MAX_RANK
SCRATCH_BYTES = (MAX_INPUTS + 2) * DIMS_BYTES + PLAN_BYTES   # input dims, output dims, broadcast temp, plan
ACC_BYTES = 8 * MAX_INPUTS
GATHER_BYTES = 4 * CHUNK * MAX_CHAIN_OPERANDS
CHUNK_STATE_BYTES = 16 * MAX_INPUTS

# how an input is read over a chunk
K_FULL, K_SCALAR, K_GENERAL, K_UNUSED = 0, 1, 2, 3

# args block (int64 words) filled by the compute for the workers
(A_OUT, A_N, A_NIN, A_INNER, A_M, A_PLAN, A_STEPS, A_ROWS) = range(8)
A_IN = 8                                  # per input: data address, element count, kind
A_CODES = A_IN + 3 * MAX_INPUTS           # per step: op code
A_OPERAND = A_CODES + MAX_STEPS           # per step: chain_args value
A_PARAMS = A_OPERAND + MAX_STEPS          # per step: two float64 parameters
ARGS_BYTES = 8 * (A_PARAMS + 2 * MAX_STEPS)

_T_BAD_PROGRAM = cstr("attributes chain_ops, chain_args and chain_params do not form a valid program "
                      "(see ortfuse.custom_ops.native_chain)")


# --------------------------------------------------------------------------------------------------
# Encoding (Python, used by the rewriter)
# --------------------------------------------------------------------------------------------------

_PARAMS = {"LeakyRelu": ("alpha", None), "Clip": ("min", "max"), "HardSigmoid": ("alpha", "beta")}


def node_attrs(attrs: dict) -> dict:
    """``chain_ops`` / ``chain_args`` / ``chain_params`` of a chain's JSON ``program`` (the format of
    ``reference.eltwise_chain``); ValueError when the native kernel cannot run it."""
    steps = json.loads(attrs["program"])
    if not 1 <= len(steps) <= MAX_STEPS:
        raise ValueError(f"the native chain kernel takes 1 to {MAX_STEPS} steps, this program has {len(steps)}")
    ops, args, params = [], [], []
    for step in steps:
        op = step["op"]
        if op not in CHAIN_OPS:
            raise ValueError(f"the native chain kernel has no op {op!r}")
        code = CHAIN_OPS.index(op)
        refs = step.get("args")
        if (refs is not None) != (code >= N_UNARY):
            raise ValueError(f"step {step} has the wrong number of arguments for {op}")
        if refs is None:
            args.append(-1)
        elif len(refs) == 2 and refs.count("x") == 1:
            other = refs[1] if refs[0] == "x" else refs[0]
            k = int(other[1:])
            if not 0 <= k < MAX_CHAIN_OPERANDS:
                raise ValueError(f"step {step} names operand {other!r}; at most {MAX_CHAIN_OPERANDS} operands")
            args.append(2 * k + (refs[0] != "x"))
        else:
            raise ValueError(f"the native chain kernel needs one 'x' and one operand per binary step, got {refs}")
        ops.append(code)
        names = _PARAMS.get(op, (None, None))
        params.extend(float(step[name]) if name else 0.0 for name in names)
    return {"chain_ops": ops, "chain_args": args, "chain_params": params}


# --------------------------------------------------------------------------------------------------
# Element math (inlined into the loops; with a constant op, LLVM folds the switch and vectorises)
# --------------------------------------------------------------------------------------------------

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)


@njit(nogil=True, error_model="numpy", cache=True)
def _unary1(op, v, p0, p1):
    """Unary op ``op`` (a code < N_UNARY) of v, as reference.eltwise_chain in float32."""
    always_inline()
    if op == OP_RELU:
        return _relu1(v)
    if op == OP_SIGMOID:
        return sigmoid_f32(v)
    if op == OP_TANH:
        return tanh_f32(v)
    if op == OP_EXP:
        return exp_f32(v)
    if op == OP_LOG:
        return math.log(v)
    if op == OP_ABS:
        return abs(v)
    if op == OP_NEG:
        return -v
    if op == OP_SQRT:
        return math.sqrt(v)
    if op == OP_RECIPROCAL:
        return _ONE / v
    if op == OP_ERF:
        return erf_f32(v)
    if op == OP_FLOOR:
        return np.floor(v)
    if op == OP_CEIL:
        return np.ceil(v)
    if op == OP_SOFTPLUS:  # log(1 + e^v) = max(v, 0) + log1p(e^-|v|); NaN stays NaN
        return (v if v > _ZERO else _ZERO) + math.log1p(exp_f32(-abs(v)))  # noqa: FURB136 - keeps NaN
    if op == OP_LEAKYRELU:
        return v if v >= _ZERO else v * p0
    if op == OP_CLIP:
        return _clip1(v, p0, p1)
    return _hardsigmoid1(v, p0, p1)


@njit(nogil=True, error_model="numpy", cache=True)
def _binary1(op, a, b):
    """Binary op ``op`` (a code >= N_UNARY) of (a, b); Max/Min as numpy's maximum/minimum."""
    always_inline()
    if op == OP_ADD:
        return a + b
    if op == OP_SUB:
        return a - b
    if op == OP_MUL:
        return a * b
    if op == OP_DIV:
        return a / b
    if op == OP_POW:
        return math.pow(a, b)
    if op == OP_MAX:
        return _max1(a, b)
    return _min1(a, b)


@njit(nogil=True, error_model="numpy", cache=True)
def _unary_loop(x, d, fresh, op, p0, p1):
    """d = op(x) (``fresh``: the chunk's first step, x is X's run) or d = op(d) in place. Two loops:
    one loop reading x that is called with x = d runs scalar (LLVM's alias check fails on equal
    addresses), so the in-place loop reads d itself."""
    always_inline()
    if fresh:
        for i in range(d.size):
            d[i] = _unary1(op, x[i], p0, p1)
    else:
        for i in range(d.size):
            d[i] = _unary1(op, d[i], p0, p1)


@njit(nogil=True, error_model="numpy", cache=True)
def _unary_loop_512(d, op):
    """d = op(d) in place, in 512-bit vectors where the target has them (vecmath.prefer_512bit): LLVM
    vectorises the loop when it compiles this function, so the attribute must sit here."""
    always_inline()
    prefer_512bit()
    for i in range(d.size):
        d[i] = _unary1(op, d[i], _ZERO, _ZERO)


@njit(nogil=True, error_model="numpy", cache=True)
def _binary_loop(x, d, fresh, c, cv, scalar, op, swap):
    """d = op(x, c) (swap: op(c, x)) when ``fresh`` (the chunk's first step), else d = op(d, c) in
    place; c is the array c, or the value cv when ``scalar``."""
    always_inline()
    n = d.size
    if fresh:
        if scalar:
            if swap:
                for i in range(n):
                    d[i] = _binary1(op, cv, x[i])
            else:
                for i in range(n):
                    d[i] = _binary1(op, x[i], cv)
        elif swap:
            for i in range(n):
                d[i] = _binary1(op, c[i], x[i])
        else:
            for i in range(n):
                d[i] = _binary1(op, x[i], c[i])
    elif scalar:
        if swap:
            for i in range(n):
                d[i] = _binary1(op, cv, d[i])
        else:
            for i in range(n):
                d[i] = _binary1(op, d[i], cv)
    elif swap:
        for i in range(n):
            d[i] = _binary1(op, c[i], d[i])
    else:
        for i in range(n):
            d[i] = _binary1(op, d[i], c[i])


# Dispatch: every branch passes its op as a constant, so once LLVM inlines the loop it holds one op's
# math and vectorises. (A loop over a tuple of op codes instead relies on LLVM fully unrolling it:
# measured 12x slower for Relu with the 11 cheap unary ops, where it did not.)


@njit(nogil=True, error_model="numpy", cache=True)
def unary_step(x, d, fresh, op, p0, p1, args, nxt, ahead):
    """d = op(x) (``fresh``) or d = op(d) in place: one loop per op, the switch outside the loops.
    A polynomial op prefetches output elements [nxt, nxt + ahead) while it runs (``prefetch_ahead``)."""
    prefer_512bit()  # see the module docstring: the cheap ops' loops stay 256-bit, the code half as large
    if op == OP_RELU:
        _unary_loop(x, d, fresh, OP_RELU, p0, p1)
    elif op == OP_LOG:
        _unary_loop(x, d, fresh, OP_LOG, p0, p1)
    elif op == OP_ABS:
        _unary_loop(x, d, fresh, OP_ABS, p0, p1)
    elif op == OP_NEG:
        _unary_loop(x, d, fresh, OP_NEG, p0, p1)
    elif op == OP_SQRT:
        _unary_loop(x, d, fresh, OP_SQRT, p0, p1)
    elif op == OP_RECIPROCAL:
        _unary_loop(x, d, fresh, OP_RECIPROCAL, p0, p1)
    elif op == OP_FLOOR:
        _unary_loop(x, d, fresh, OP_FLOOR, p0, p1)
    elif op == OP_CEIL:
        _unary_loop(x, d, fresh, OP_CEIL, p0, p1)
    elif op == OP_LEAKYRELU:
        _unary_loop(x, d, fresh, OP_LEAKYRELU, p0, p1)
    elif op == OP_CLIP:
        _unary_loop(x, d, fresh, OP_CLIP, p0, p1)
    elif op == OP_HARDSIGMOID:
        _unary_loop(x, d, fresh, OP_HARDSIGMOID, p0, p1)
    else:
        if fresh:  # X into the chunk, then in place: the math dwarfs this pass through L1
            for i in range(d.size):
                d[i] = x[i]
        for s in range(0, d.size, PIECE):
            if s < ahead:
                prefetch_ahead(args, nxt + s, min(PIECE, ahead - s))
            _unary_math_step(d[s:s + PIECE], op)


@njit(nogil=True, cache=True)
def prefetch_ahead(args, pos, count):
    """Cache hints for output elements [pos, pos + count): the output's lines with intent to write, and
    the lines of each input read as a run of its buffer (K_FULL). A chunk's polynomial step runs
    from L1 with no memory traffic of its own; hinting the next chunk meanwhile keeps loads and
    write-allocations of main memory in flight (0.5 tanh(x + b) on 32M floats, 1 thread: 25.4 -> 18.7
    ms in a pure-numba model of this loop, against 16.7 ms for a copy)."""
    always_inline()
    prefetch_lines(load_i64(args + 8 * A_OUT) + 4 * pos, 4 * count, True)
    for j in range(load_i64(args + 8 * A_NIN)):
        base = args + 8 * (A_IN + 3 * j)
        if load_i64(base + 16) == K_FULL:
            prefetch_lines(load_i64(base) + 4 * pos, 4 * count, False)


@njit(nogil=True, error_model="numpy", cache=True)
def _unary_math_step(d, op):
    """The polynomial ops, in 512-bit vectors where the target has them."""
    if op == OP_SIGMOID:
        _unary_loop_512(d, OP_SIGMOID)
    elif op == OP_TANH:
        _unary_loop_512(d, OP_TANH)
    elif op == OP_EXP:
        _unary_loop_512(d, OP_EXP)
    elif op == OP_ERF:
        _unary_loop_512(d, OP_ERF)
    elif op == OP_SOFTPLUS:
        _unary_loop_512(d, OP_SOFTPLUS)


@njit(nogil=True, error_model="numpy", cache=True)
def binary_step(x, d, fresh, c, cv, scalar, op, swap):
    """d = op(x, c) or op(c, x) (``fresh``), or op(d, c) or op(c, d) in place; c an array or
    (``scalar``) the value cv."""
    prefer_512bit()  # as in unary_step
    if op == OP_ADD:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_ADD, swap)
    elif op == OP_SUB:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_SUB, swap)
    elif op == OP_MUL:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_MUL, swap)
    elif op == OP_DIV:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_DIV, swap)
    elif op == OP_MAX:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_MAX, swap)
    elif op == OP_MIN:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_MIN, swap)
    elif scalar and not swap and (cv == np.float32(2.0) or cv == np.float32(3.0)):
        cube = cv == np.float32(3.0)  # ORT's Pow by a repeated exponent 2 or 3: x*x or x*x*x
        if fresh:
            for i in range(d.size):
                v = x[i]
                d[i] = v * v * (v if cube else _ONE)
        else:
            for i in range(d.size):
                v = d[i]
                d[i] = v * v * (v if cube else _ONE)
    else:
        _binary_loop(x, d, fresh, c, cv, scalar, OP_POW, swap)


# --------------------------------------------------------------------------------------------------
# Broadcast plan and chunk access
# --------------------------------------------------------------------------------------------------


@njit(cache=True)
def collapse(dims, ranks, nin, do, ro, plan):
    """Write the collapsed broadcast of ``nin`` inputs (dims at dims + j*DIMS_BYTES, rank at
    ranks + 8j; rank 0 for an input that is not read) into the output dims at ``do``: records
    (extent, stride of each input in elements, 0 = repeats), innermost first. Adjacent dims merge
    when every input follows across both or repeats across both. Returns the record count (>= 1)."""
    acc = stack_bytes(ACC_BYTES)
    for j in range(nin):
        store_i64(acc + 8 * j, 1)
    m = 0
    for k in range(ro - 1, -1, -1):
        ext = load_i64(do + 8 * k)
        if ext == 1:
            continue
        prev = plan + 8 * PLAN_REC * (m - 1)
        merge = m > 0
        rec = plan + 8 * PLAN_REC * m
        for j in range(nin):
            ij = load_i64(ranks + 8 * j) - ro + k
            follows = ij >= 0 and load_i64(dims + DIMS_BYTES * j + 8 * ij) == ext
            stride = load_i64(acc + 8 * j) if follows else 0
            store_i64(rec + 8 * (1 + j), stride)  # written past the last record: harmless scratch
            if merge:
                ps = load_i64(prev + 8 * (1 + j))
                if not ((stride == 0 and ps == 0) or (stride != 0 and ps != 0 and stride == ps * load_i64(prev))):
                    merge = False
            if follows:
                store_i64(acc + 8 * j, load_i64(acc + 8 * j) * ext)
        if merge:
            store_i64(prev, load_i64(prev) * ext)
        else:
            store_i64(rec, ext)
            m += 1
    if m == 0:  # every dim is 1: one element
        store_i64(plan, 1)
        for j in range(nin):
            store_i64(plan + 8 * (1 + j), 0)
        m = 1
    return m


@njit(cache=True)
def row_offset(plan, m, j, row):
    """Element offset in input j of the first element of output row ``row`` (dims above the innermost)."""
    off = np.int64(0)
    r = row
    for d in range(1, m):
        rec = plan + 8 * PLAN_REC * d
        ext = load_i64(rec)
        off += (r % ext) * load_i64(rec + 8 * (1 + j))
        r //= ext
    return off


@njit(cache=True)
def _f32(addr, n):
    return carray(int_to_voidptr(addr), (n,), np.float32)


@njit(nogil=True, cache=True)
def gather(plan, m, j, src_addr, count, dst_addr, pos, seg, inner):
    """Write input j's elements for output elements [pos, pos + seg) to dst, row piece by row piece."""
    src = _f32(src_addr, count)
    dst = _f32(dst_addr, seg)
    s = load_i64(plan + 8 * (1 + j))
    p = 0
    while p < seg:
        q = pos + p
        row = q // inner
        col = q - row * inner
        ln = min(seg - p, inner - col)
        off = row_offset(plan, m, j, row) + col * s
        piece = dst[p:p + ln]
        if s != 0:
            run = src[off:off + ln]
            for i in range(ln):
                piece[i] = run[i]
        else:
            v = src[off]
            for i in range(ln):
                piece[i] = v
        p += ln


@njit(nogil=True, cache=True)
def resolve(args, j, pos, seg, scratch):
    """(address, is_scalar) of input j over output elements [pos, pos + seg): a run of seg floats
    in its buffer, one float, or the run gathered at ``scratch``."""
    base = args + 8 * (A_IN + 3 * j)
    ptr = load_i64(base)
    kind = load_i64(base + 16)
    if kind == K_FULL:
        return ptr + 4 * pos, False
    if kind == K_SCALAR:
        return ptr, True
    plan = load_i64(args + 8 * A_PLAN)
    m = load_i64(args + 8 * A_M)
    inner = load_i64(args + 8 * A_INNER)
    if load_i64(args + 8 * A_ROWS) != 0:  # the chunk lies in one row: a run or one element
        row = pos // inner
        s = load_i64(plan + 8 * (1 + j))
        return ptr + 4 * (row_offset(plan, m, j, row) + (pos - row * inner) * s), s == 0
    gather(plan, m, j, ptr, load_i64(base + 8), scratch, pos, seg, inner)
    return scratch, False


@njit(nogil=True, error_model="numpy", cache=True)
def run_chunk(args, pos, seg, scratch, state, ahead):
    """Output elements [pos, pos + seg): the first step reads X and writes the output, every later
    step runs in place on the output (in L1). The first polynomial step prefetches the next
    ``ahead`` elements (the next chunk of the same block)."""
    nin = load_i64(args + 8 * A_NIN)
    out_addr = load_i64(args + 8 * A_OUT) + 4 * pos
    d = _f32(out_addr, seg)
    addr, scalar = resolve(args, 0, pos, seg, out_addr)  # gathered X lands in the output chunk
    x = _f32(addr, 1 if scalar else seg)
    fresh = not scalar and addr != out_addr
    if scalar:
        v = x[0]
        for i in range(seg):
            d[i] = v
    for j in range(1, nin):
        if load_i64(args + 8 * (A_IN + 3 * j + 2)) != K_UNUSED:
            addr, scalar = resolve(args, j, pos, seg, scratch + 4 * CHUNK * (j - 1))
            store_i64(state + 16 * j, addr)
            store_i64(state + 16 * j + 8, scalar)
    for s in range(load_i64(args + 8 * A_STEPS)):
        code = load_i64(args + 8 * (A_CODES + s))
        p0 = np.float32(load_f64(args + 8 * (A_PARAMS + 2 * s)))
        p1 = np.float32(load_f64(args + 8 * (A_PARAMS + 2 * s + 1)))
        if code < N_UNARY:
            unary_step(x, d, fresh, code, p0, p1, args, pos + seg, ahead)
            if code in _MATH_OPS:
                ahead = 0
        else:
            operand = load_i64(args + 8 * (A_OPERAND + s))
            j = 1 + (operand >> 1)
            scalar = load_i64(state + 16 * j + 8) != 0
            c = _f32(load_i64(state + 16 * j), 1 if scalar else seg)
            binary_step(x, d, fresh, c, c[0], scalar, code, (operand & 1) != 0)
        fresh = False


@njit(nogil=True, error_model="numpy", cache=True)
def run_block(args, block, scratch):
    n = load_i64(args + 8 * A_N)
    inner = load_i64(args + 8 * A_INNER)
    rows = load_i64(args + 8 * A_ROWS) != 0
    state = stack_bytes(CHUNK_STATE_BYTES)
    pos = block * BLOCK
    end = min(n, pos + BLOCK)  # hints stay in the block (another thread may own the next), and are
    hints = n >= HINT_MIN      # left out where the tensors fit in L2
    while pos < end:
        seg = min(end - pos, CHUNK)
        if rows:
            seg = min(seg, inner - pos % inner)
        run_chunk(args, pos, seg, scratch, state, min(end - pos - seg, CHUNK) if hints else 0)
        pos += seg


def _chain_worker(args, block):
    if load_i64(args + 8 * A_ROWS) != 0:
        run_block(args, block, 0)
    else:
        scratch = stack_bytes(GATHER_BYTES)
        run_block(args, block, scratch)


# --------------------------------------------------------------------------------------------------
# Compute
# --------------------------------------------------------------------------------------------------


@njit(cache=True)
def _valid_program(kernel, n_operands):
    steps = slot_i64(kernel, W_OPS)
    if steps < 1 or slot_i64(kernel, W_ARGS) != steps or slot_i64(kernel, W_PARAMS) != 2 * steps:
        return False
    for s in range(steps):
        code = slot_i64(kernel, W_OPS + 1 + s)
        operand = slot_i64(kernel, W_ARGS + 1 + s)
        if code < 0 or code >= N_OPS:
            return False
        if code < N_UNARY and operand != -1:
            return False
        if code >= N_UNARY and (operand < 0 or (operand >> 1) >= n_operands):
            return False
    return True


def _compute_chain(kernel, ctx):
    """Check inputs and program, broadcast the shapes, allocate the output and run the blocks."""
    api = slot_api(kernel)
    nin = load_i64(load_i64(kernel + 8 * S_RECORD) + EXT + 8 * EXT_N_INPUTS)
    st = check_input_count(api, ctx, kernel, nin)
    if st != 0:
        return st
    if not _valid_program(kernel, nin - 1):
        return fail(api, kernel, _T_BAD_PROGRAM)
    scratch = stack_bytes(SCRATCH_BYTES)
    dims = scratch
    do = scratch + MAX_INPUTS * DIMS_BYTES
    tmp = do + DIMS_BYTES
    plan = tmp + DIMS_BYTES
    ranks = stack_bytes(ACC_BYTES)
    args = stack_bytes(ARGS_BYTES)
    steps = slot_i64(kernel, W_OPS)
    for s in range(steps):
        code = slot_i64(kernel, W_OPS + 1 + s)
        operand = slot_i64(kernel, W_ARGS + 1 + s)
        store_i64(args + 8 * (A_CODES + s), code)
        store_i64(args + 8 * (A_OPERAND + s), operand)
        for w in range(2):
            store_f64(args + 8 * (A_PARAMS + 2 * s + w), load_f64(kernel + 8 * (ATTR_BASE + W_PARAMS + 1 + 2 * s + w)))
        if code >= N_UNARY:
            store_i64(args + 8 * (A_IN + 3 * (1 + (operand >> 1)) + 2), K_GENERAL)  # marks the operand used
    for j in range(nin):
        st, ptr, rank = read_float_input(api, ctx, kernel, j, dims + DIMS_BYTES * j)
        if st != 0:
            return st
        used = j == 0 or load_i64(args + 8 * (A_IN + 3 * j + 2)) == K_GENERAL
        store_i64(ranks + 8 * j, rank if used else 0)
        store_i64(args + 8 * (A_IN + 3 * j), ptr)
        store_i64(args + 8 * (A_IN + 3 * j + 1), element_count(dims + DIMS_BYTES * j, rank))
        store_i64(args + 8 * (A_IN + 3 * j + 2), K_GENERAL if used else K_UNUSED)
    # output shape: the running shape broadcast with each operand, in step order
    ro = load_i64(ranks)
    for i in range(ro):
        store_i64(do + 8 * i, load_i64(dims + 8 * i))
    for s in range(steps):
        if load_i64(args + 8 * (A_CODES + s)) >= N_UNARY:
            j = 1 + (load_i64(args + 8 * (A_OPERAND + s)) >> 1)
            dj = dims + DIMS_BYTES * j
            rj = load_i64(ranks + 8 * j)
            r2 = broadcast_dims(do, ro, dj, rj, tmp)
            if r2 < 0:
                return broadcast_error(api, kernel, do, ro, dj, rj)
            for i in range(r2):
                store_i64(do + 8 * i, load_i64(tmp + 8 * i))
            ro = r2
    st, po = make_output(api, ctx, 0, do, ro)
    if st != 0:
        return st
    n = element_count(do, ro)
    if n == 0:
        return 0
    m = collapse(dims, ranks, nin, do, ro, plan)
    inner = load_i64(plan)
    for j in range(nin):
        kind_word = args + 8 * (A_IN + 3 * j + 2)
        if load_i64(kind_word) == K_GENERAL:
            count = load_i64(args + 8 * (A_IN + 3 * j + 1))
            store_i64(kind_word, K_FULL if count == n else (K_SCALAR if count == 1 else K_GENERAL))
    store_i64(args + 8 * A_OUT, po)
    store_i64(args + 8 * A_N, n)
    store_i64(args + 8 * A_NIN, nin)
    store_i64(args + 8 * A_INNER, inner)
    store_i64(args + 8 * A_M, m)
    store_i64(args + 8 * A_PLAN, plan)
    store_i64(args + 8 * A_STEPS, steps)
    store_i64(args + 8 * A_ROWS, 1 if inner >= ROW_MIN else 0)
    return run_blocks(api, ctx, kernel, args, (n + BLOCK - 1) // BLOCK, n)


# --------------------------------------------------------------------------------------------------
# The entries of native_ops.NATIVE_OPS (native_ops imports this module at its end)
# --------------------------------------------------------------------------------------------------

CHAIN_OP_DEFS = {
    f"FusedEltwiseChain{k}": NativeOpDef(f"FusedEltwiseChain{k}", ("X",) + tuple(f"C{i}" for i in range(k)),
                                         _compute_chain, _chain_worker, attrs=CHAIN_ATTRS, node_attrs=node_attrs)
    for k in range(MAX_CHAIN_OPERANDS + 1)
}
NATIVE_OPS.update(CHAIN_OP_DEFS)
