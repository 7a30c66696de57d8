"""Winograd F(4x4, 3x3) convolution kernels on NCHWc blocked tensors (docs/ARCHITECTURE.md §9).

A 3x3 stride-1 convolution with padding 1 is computed per 4x4 output tile from a 6x6 input patch:

    Y = AT [ sum_c (G w G^T)[oc, c] * (BT d_c BT^T) ] AT^T        (elementwise product per position)

``conv_filters.transform_filter`` makes ``U[36, Cin, Cout] = G w G^T`` once; the kernel
transforms input patches (``input_tile``), multiplies per position with the register-blocked
``micro_gemm`` (one [tiles, Cin] x [Cin, Cout] product for each of the 36 positions), and transforms
back (``output_tile``, bias added). Each tile's channel lanes are one NCHWc block: every vector is a
block of ``W`` channels (8 with AVX2, 16 with AVX-512), loaded and stored whole.

The three building blocks are LLVM intrinsics over ``<W x float>`` vectors (numba's loop vectorizer
does not keep accumulators in registers or vectorize the transforms across the block's lanes):
their constant arguments (tile rows, vector count, W) pick the code at compile time. Addresses and
strides are int64 (strides in float32 elements); loads and stores need only 4-byte alignment.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import RequireLiteralValue
from numba.extending import intrinsic

from ortfuse.custom_ops.kernels.conv_filters import ALPHA, AT, BT, TILE

_F32 = ir.FloatType()
_I64 = ir.IntType(64)


def _literal(t, what: str) -> int:
    if not isinstance(t, types.IntegerLiteral):
        raise RequireLiteralValue(f"{what} must be a constant")
    return int(t.literal_value)


def _vec(w: int):
    vt = ir.VectorType(_F32, w)
    return vt, _F32.as_pointer(), vt.as_pointer()


def _at(builder, base, offset):
    return builder.gep(base, [offset])


def _k(v: int):
    return ir.Constant(_I64, v)


def _combine(builder, coeffs, vals, vt):
    """sum_k coeffs[k] * vals[k] as vector IR (zeros skipped, +-1 as add or subtract)."""
    acc = None
    for c, v in zip(coeffs, vals):
        c = float(c)
        if c == 0.0:
            continue
        term = v if abs(c) == 1.0 else builder.fmul(v, ir.Constant(vt, [abs(c)] * vt.count))
        if acc is None:
            acc = builder.fsub(ir.Constant(vt, [0.0] * vt.count), term) if c < 0 else term
        else:
            acc = builder.fsub(acc, term) if c < 0 else builder.fadd(acc, term)
    return acc if acc is not None else ir.Constant(vt, [0.0] * vt.count)


@intrinsic
def micro_gemm(typingctx, a, lda, b, ldb, c, ldc, k, rows, vecs, width):
    """C[rows, vecs*width] = A[rows, k] @ B[k, vecs*width] (row strides lda, ldb, ldc), the
    rows x vecs accumulators held in vector registers over the whole depth k."""
    rt, nv, w = _literal(rows, "rows"), _literal(vecs, "vecs"), _literal(width, "width")
    sig = types.void(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64, types.int64,
                     rows, vecs, width)

    def codegen(context, builder, sig, args):
        a, lda, b, ldb, c, ldc, k = args[:7]
        vt, fp, vp = _vec(w)
        accs = [[cgutils.alloca_once(builder, vt) for _ in range(nv)] for _ in range(rt)]
        for row in accs:
            for s in row:
                builder.store(ir.Constant(vt, [0.0] * w), s)
        ap, bp, cp = (builder.inttoptr(v, fp) for v in (a, b, c))
        arows = [_at(builder, ap, builder.mul(lda, _k(r))) for r in range(rt)]
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]), f"llvm.fma.v{w}f32")
        undef = ir.Constant(vt, ir.Undefined)
        splat = ir.Constant(ir.VectorType(ir.IntType(32), w), [0] * w)
        with cgutils.for_range(builder, k) as loop:
            i = loop.index
            brow = _at(builder, bp, builder.mul(i, ldb))
            bv = [builder.load(builder.bitcast(_at(builder, brow, _k(v * w)), vp), align=4) for v in range(nv)]
            for r in range(rt):
                s = builder.load(_at(builder, arows[r], i))
                sv = builder.shuffle_vector(builder.insert_element(undef, s, ir.Constant(ir.IntType(32), 0)),
                                            undef, splat)
                for v in range(nv):
                    builder.store(builder.call(fma, [sv, bv[v], builder.load(accs[r][v])]), accs[r][v])
        for r in range(rt):
            crow = _at(builder, cp, builder.mul(ldc, _k(r)))
            for v in range(nv):
                builder.store(builder.load(accs[r][v]), builder.bitcast(_at(builder, crow, _k(v * w)), vp), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def input_tile(typingctx, src, rs, cs, dst, ds, width):
    """V[p] = (BT d BT^T)[p // 6, p % 6] for the 6x6 patch d[i, j] at src + i*rs + j*cs, each a
    vector of ``width`` lanes; V[p] stored at dst + p*ds."""
    w = _literal(width, "width")
    sig = types.void(types.int64, types.int64, types.int64, types.int64, types.int64, width)

    def codegen(context, builder, sig, args):
        src, rs, cs, dst, ds = args[:5]
        vt, fp, vp = _vec(w)
        sp, dp = builder.inttoptr(src, fp), builder.inttoptr(dst, fp)
        def patch(i, j):
            at = builder.add(builder.mul(rs, _k(i)), builder.mul(cs, _k(j)))
            return builder.load(builder.bitcast(_at(builder, sp, at), vp), align=4)

        d = [[patch(i, j) for j in range(ALPHA)] for i in range(ALPHA)]
        t = [[_combine(builder, BT[i], [d[a][j] for a in range(ALPHA)], vt) for j in range(ALPHA)]
             for i in range(ALPHA)]
        for i in range(ALPHA):
            for j in range(ALPHA):
                v = _combine(builder, BT[j], t[i], vt)
                builder.store(v, builder.bitcast(_at(builder, dp, builder.mul(ds, _k(i * ALPHA + j))), vp), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def output_tile(typingctx, src, ss, bias, dst, rs, cs, width):
    """Y[i, j] = (AT M AT^T)[i, j] + bias for M[p] at src + p*ss; the 4x4 vectors stored at
    dst + i*rs + j*cs; bias: one vector of ``width`` lanes."""
    w = _literal(width, "width")
    sig = types.void(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64, width)

    def codegen(context, builder, sig, args):
        src, ss, bias, dst, rs, cs = args[:6]
        vt, fp, vp = _vec(w)
        sp, dp = builder.inttoptr(src, fp), builder.inttoptr(dst, fp)
        bv = builder.load(builder.bitcast(builder.inttoptr(bias, fp), vp), align=4)
        m = [[builder.load(builder.bitcast(_at(builder, sp, builder.mul(ss, _k(a * ALPHA + b))), vp), align=4)
              for b in range(ALPHA)] for a in range(ALPHA)]
        t = [[_combine(builder, AT[i], [m[a][b] for a in range(ALPHA)], vt) for b in range(ALPHA)] for i in range(TILE)]
        for i in range(TILE):
            for j in range(TILE):
                v = builder.fadd(_combine(builder, AT[j], t[i], vt), bv)
                at = builder.add(builder.mul(rs, _k(i)), builder.mul(cs, _k(j)))
                builder.store(v, builder.bitcast(_at(builder, dp, at), vp), align=4)
        return context.get_dummy_value()

    return sig, codegen
