"""Pointwise (1x1) convolution micro-kernel on NCHWc blocked tensors (docs/ARCHITECTURE.md §9).

A 1x1 convolution is, per image, Y[co, p] = B[co] + sum_ci W[co, ci] X[ci, p] over the positions p
of the image. On blocked tensors (``W`` channels per block: 8 with AVX2, 16 with AVX-512, one
vector) ``pw_tile`` computes R consecutive positions of V output blocks,

    acc[r][v] = B[v] + sum_{cb < Cin / W} sum_{j < W} x[cb][r][j] * P[cb * W + j][v]

(over a concatenation of inputs, one call per input: the first starts from B, each next one from
the partial sums the last stored in Y, with P's rows of that input's channels)

where x[cb][r] is the vector of input block cb at position r (one scalar of it, broadcast, per j) and
P[ci][v] the vector of V * W packed filter values of input channel ci for output block v. The R x V
accumulators stay in vector registers over the whole input depth; per input channel the V filter
vectors are loaded once and each input scalar once.

``pw_tile`` is an LLVM intrinsic over ``<W x float>`` vectors, as ``winograd.micro_gemm``: its
constant arguments (R, V, W) pick the code at compile time. Addresses and strides are int64, strides
in float32 elements; loads and stores need only 4-byte alignment.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ortfuse.custom_ops.kernels.winograd import _at, _k, _literal, _vec


@intrinsic
def pw_tile(typingctx, x, xbs, p, bias, y, ybs, cblocks, accumulate, rows, vecs, width):
    """y[v * ybs + r * W] = s + sum over cb < cblocks, j < W of x[cb * xbs + r * W + j] *
    p[(cb * W + j) * V * W + v * W], for r < R, v < V (each a vector of W lanes), s = bias[v * W], or
    y's own value there when ``accumulate`` is nonzero (the next input of a concatenation): R =
    ``rows``, V = ``vecs``, W = ``width``, all constants."""
    rt, nv, w = _literal(rows, "rows"), _literal(vecs, "vecs"), _literal(width, "width")
    sig = types.void(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64, types.int64,
                     types.int64, rows, vecs, width)

    def codegen(context, builder, sig, args):
        x, xbs, p, bias, y, ybs, cb, acc = args[:8]
        vt, fp, vp = _vec(w)
        xp, pp, bp, yp = (builder.inttoptr(v, fp) for v in (x, p, bias, y))
        accs = [[cgutils.alloca_once(builder, vt) for _ in range(nv)] for _ in range(rt)]
        with builder.if_else(builder.icmp_signed("!=", acc, _k(0))) as (partial, fresh):
            with partial:
                for r, row in enumerate(accs):
                    for v, s in enumerate(row):
                        src = _at(builder, yp, builder.add(builder.mul(ybs, _k(v)), _k(r * w)))
                        builder.store(builder.load(builder.bitcast(src, vp), align=4), s)
            with fresh:
                bv = [builder.load(builder.bitcast(_at(builder, bp, _k(v * w)), vp), align=4) for v in range(nv)]
                for row in accs:
                    for v, s in enumerate(row):
                        builder.store(bv[v], s)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]), f"llvm.fma.v{w}f32")
        undef = ir.Constant(vt, ir.Undefined)
        splat = ir.Constant(ir.VectorType(ir.IntType(32), w), [0] * w)
        with cgutils.for_range(builder, cb) as loop:
            i = loop.index
            xb = _at(builder, xp, builder.mul(i, xbs))
            pb = _at(builder, pp, builder.mul(i, _k(w * nv * w)))
            for j in range(w):
                pv = [builder.load(builder.bitcast(_at(builder, pb, _k((j * nv + v) * w)), vp), align=4)
                      for v in range(nv)]
                for r in range(rt):
                    s = builder.load(_at(builder, xb, _k(r * w + j)))
                    sv = builder.shuffle_vector(builder.insert_element(undef, s, ir.Constant(ir.IntType(32), 0)),
                                                undef, splat)
                    for v in range(nv):
                        builder.store(builder.call(fma, [sv, pv[v], builder.load(accs[r][v])]), accs[r][v])
        for r in range(rt):
            for v in range(nv):
                dst = _at(builder, yp, builder.add(builder.mul(ybs, _k(v)), _k(r * w)))
                builder.store(builder.load(accs[r][v]), builder.bitcast(dst, vp), align=4)
        return context.get_dummy_value()

    return sig, codegen
