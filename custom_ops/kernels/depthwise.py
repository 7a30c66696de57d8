"""Depthwise convolution micro-kernel on NCHWc blocked tensors (docs/ARCHITECTURE.md §9).

A depthwise convolution (one filter per channel, group = C) of a K x K filter at horizontal stride S
computes, for one block of ``W`` channels (8 with AVX2, 16 with AVX-512: one vector) and R
consecutive outputs of one output row,

    acc[r] = bias + sum_{ky in [ky0, ky1)} sum_{kx < K} f[ky, kx] * x[ky, r * S + kx]

where ``x[ky, c]`` is the vector of the input row ky (of the rows the output row reads) at column c
(its W lanes are W channels) and ``f[ky, kx]`` the vector of the K*K filter taps of those channels.
Rows outside [ky0, ky1) are the zero padding above and below the image: they are skipped, never
read. The R accumulators stay in vector registers over the whole filter; per filter row the K
filter vectors and the (R - 1) * S + K input vectors the R outputs share are loaded once (a column
is read by up to K outputs at stride 1). Columns of the padding left and right are not handled here:
the caller gives R outputs whose every tap is inside the row. The epilogue of the clamp family
(Relu, Clip, HardSigmoid, HardSwish) is applied to the accumulators before they are stored.

``dw_row`` is an LLVM intrinsic over ``<W x float>`` vectors, as ``winograd.micro_gemm`` (numba's
loop vectorizer keeps neither the accumulators in registers nor the vector across the block's
lanes): its constant arguments (R, K, S, W) pick the code at compile time. Addresses and strides are
int64, strides in float32 elements; loads and stores need only 4-byte alignment.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ortfuse.custom_ops.kernels.winograd import _F32, _at, _k, _literal, _vec


@intrinsic
def dw_row(typingctx, src, rs, filt, ky0, ky1, bias, dst, ep, outs, ksize, stride, width):
    """dst[r] = epi(bias + sum over ky in [ky0, ky1), kx < K of filt[ky*K + kx] * src[ky*rs + (r*S + kx)*W])
    for r < R (dst[r] at dst + r*W): R = ``outs``, K = ``ksize``, S = ``stride``, W = ``width``,
    all constants; filt holds K*K vectors of W lanes, bias one. ``ep`` points at the epilogue's
    eight float32 words (a, b, lo, hi, g, c, d, f): t = min(max(a*v + b, lo), hi) (a NaN passes both),
    e = v*t if g != 0 else t, epi(v) = c*e + d if f != 0 else e; (1, 0, -inf, inf, 0, 1, 0, 0) is the
    identity."""
    r_n, k_n, s_n, w = (_literal(outs, "outs"), _literal(ksize, "ksize"), _literal(stride, "stride"),
                        _literal(width, "width"))
    sig = types.void(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64, types.int64,
                     types.int64, outs, ksize, stride, width)

    def codegen(context, builder, sig, args):
        src, rs, filt, ky0, ky1, bias, dst, ep = args[:8]
        vt, fp, vp = _vec(w)
        sp, fpp, dp, epp = (builder.inttoptr(v, fp) for v in (src, filt, dst, ep))
        bv = builder.load(builder.bitcast(builder.inttoptr(bias, fp), vp), align=4)
        split = k_n if r_n < 4 else 1  # few outputs: one chain per filter column, else FMA latency binds
        accs = [[cgutils.alloca_once(builder, vt) for _ in range(split)] for _ in range(r_n)]
        for chains in accs:
            for j, a in enumerate(chains):
                builder.store(bv if j == 0 else ir.Constant(vt, [0.0] * w), a)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]), f"llvm.fma.v{w}f32")
        count = builder.sub(ky1, ky0)
        with cgutils.for_range(builder, count) as loop:
            ky = builder.add(loop.index, ky0)
            row = _at(builder, sp, builder.mul(ky, rs))
            frow = _at(builder, fpp, builder.mul(ky, _k(k_n * w)))
            fv = [builder.load(builder.bitcast(_at(builder, frow, _k(kx * w)), vp), align=4) for kx in range(k_n)]
            cols = (r_n - 1) * s_n + k_n
            xv = [builder.load(builder.bitcast(_at(builder, row, _k(c * w)), vp), align=4) for c in range(cols)]
            for r in range(r_n):
                acc = [builder.load(a) for a in accs[r]]
                for kx in range(k_n):
                    acc[kx % split] = builder.call(fma, [xv[r * s_n + kx], fv[kx], acc[kx % split]])
                for a, v in zip(accs[r], acc):
                    builder.store(v, a)
        undef = ir.Constant(vt, ir.Undefined)
        splat = ir.Constant(ir.VectorType(ir.IntType(32), w), [0] * w)

        def word(i):
            s = builder.load(_at(builder, epp, _k(i)))
            return builder.shuffle_vector(builder.insert_element(undef, s, ir.Constant(ir.IntType(32), 0)), undef,
                                          splat)

        ea, eb, lo, hi = (word(i) for i in range(4))
        mult = builder.fcmp_unordered("une", builder.load(_at(builder, epp, _k(4))), ir.Constant(_F32, 0.0))
        ec, ed = word(5), word(6)
        mapped = builder.fcmp_unordered("une", builder.load(_at(builder, epp, _k(7))), ir.Constant(_F32, 0.0))
        for r in range(r_n):
            parts = [builder.load(a) for a in accs[r]]
            v = parts[0]
            for p in parts[1:]:
                v = builder.fadd(v, p)
            t = builder.call(fma, [ea, v, eb])
            t = builder.select(builder.fcmp_unordered("ult", lo, t), t, lo)  # max: lo unless t > lo or NaN
            t = builder.select(builder.fcmp_unordered("ugt", hi, t), t, hi)  # min: hi unless t < hi or NaN
            out = builder.select(mult, builder.fmul(v, t), t)
            out = builder.select(mapped, builder.call(fma, [ec, out, ed]), out)
            builder.store(out, builder.bitcast(_at(builder, dp, _k(r * w)), vp), align=4)
        return context.get_dummy_value()

    return sig, codegen
