"""gemm_act: Gemm, or MatMul (any rank, constant 2-D weight) [+ bias Add], then an epilogue of
Relu, Gelu (ONNX op, erf or tanh decompositions) or Relu then Gelu, as one FusedGemmAct.

Gemm's alpha, beta and transB are folded into the weights: W' = alpha * op(B), b' = beta * C.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortfuse.custom_ops import reference
from ortfuse.custom_ops.specs import OpSpec
from ortfuse.fusion.rulekit.checks import attr, float32_problem, intermediate_problem
from ortfuse.fusion.rulekit.contract import Anchor, Example, LoweringForm, NativeKernel, PatternRule
from ortfuse.fusion.rulekit.epilogues import SQRT2, Epilogue, match_gelu
from ortfuse.fusion.rulekit.examples import model, weights
from ortfuse.fusion.rulekit.lowering import MS_DOMAIN, Context, epilogue, node, then
from ortfuse.fusion.rulekit.result import Lowered, Match, Reject
from ortfuse.ir.graph import GraphIndex

ID = "gemm_act"


def _epilogue(ix: GraphIndex, x: str) -> Epilogue | None:
    """Relu | Gelu | Relu then Gelu, as one Epilogue."""
    relu = ix.child(x, "Relu", domain=None)
    if relu is not None:
        gelu = match_gelu(ix, relu.output[0])
        if gelu is not None:
            return Epilogue("relu+" + gelu.kind, [relu] + gelu.nodes, gelu.output)
        return Epilogue("relu", [relu], relu.output[0])
    return match_gelu(ix, x)


def _core(ix: GraphIndex, anchor: onnx.NodeProto):
    """(nodes, output, W [K,N], b [N]) or a Reject, or None when the node is not a candidate."""
    if anchor.op_type == "Gemm":
        w = ix.const(anchor.input[1])
        if w is None:
            return Reject(ID, [anchor], f"Gemm weight '{anchor.input[1]}' is not a constant")
        if attr(anchor, "transA", 0):
            return Reject(ID, [anchor], "Gemm transA=1 is not supported")
        w = w.astype(np.float64)
        if attr(anchor, "transB", 0):
            w = w.T
        w = w * float(attr(anchor, "alpha", 1.0))
        n = w.shape[1]
        bias = np.zeros(n)
        if len(anchor.input) > 2 and anchor.input[2]:
            c = ix.const(anchor.input[2])
            if c is None:
                return Reject(ID, [anchor], f"Gemm bias '{anchor.input[2]}' is not a constant")
            if c.size not in (1, n) or (c.ndim == 2 and c.shape[0] != 1):
                return Reject(ID, [anchor], f"Gemm bias of shape {list(c.shape)} is not a per-column bias")
            bias = np.broadcast_to(c.astype(np.float64).reshape(-1), (n,)) * float(attr(anchor, "beta", 1.0))
        return [anchor], anchor.output[0], w, bias
    w = ix.const(anchor.input[1])  # a MatMul
    if w is None or w.ndim != 2:
        return None  # activation x activation MatMul (attention): not this pattern
    n = w.shape[1]
    nodes, out, bias = [anchor], anchor.output[0], np.zeros(n)
    add = ix.child(out, "Add", domain=None)
    if add is not None:
        b = ix.const(ix.other_input(add, out) or "")
        x_rank = len(ix.shape(anchor.input[0]) or []) or 2  # MatMul output rank = x's rank (x rank >= 2)
        if b is not None and b.size == n and b.ndim <= x_rank and all(d == 1 for d in b.shape[:-1]):
            nodes, out, bias = nodes + [add], add.output[0], b.astype(np.float64).reshape(n)
    return nodes, out, w.astype(np.float64), bias


# Gemm | MatMul [-> Add(bias)] -> Relu | Gelu | Relu -> Gelu   ->   FusedGemmAct(X, W', b')
def match(ix: GraphIndex, anchor: onnx.NodeProto) -> Match | Reject | None:
    core = _core(ix, anchor)
    if core is None or isinstance(core, Reject):
        return core
    nodes, out, w, bias = core
    epi = _epilogue(ix, out)
    if epi is None:
        return None  # without an epilogue ORT fuses it itself (MatMul+Add -> Gemm)
    nodes = nodes + epi.nodes
    problem = float32_problem(ix, anchor.input[0], epi.output) or intermediate_problem(ix, nodes, epi.output)
    x_shape = ix.shape(anchor.input[0])
    k = x_shape[-1] if x_shape else None
    if not problem and isinstance(k, int) and k != w.shape[0]:  # ORT fails such a model at run time, not load
        problem = f"input '{anchor.input[0]}' is declared with {k} columns but the weight has {w.shape[0]} rows"
    if problem:
        return Reject(ID, nodes, problem)
    base = f"{ix.name_of(anchor)}_fused"
    inits = [numpy_helper.from_array(w.astype(np.float32), ix.unique_name(f"{base}_W")),
             numpy_helper.from_array(bias.astype(np.float32), ix.unique_name(f"{base}_B"))]
    return Match(ID, "FusedGemmAct", nodes, [anchor.input[0]] + [t.name for t in inits], epi.output,
                 {"activation": epi.kind}, inits)


# FusedGemmAct(X, W[K, N], B[N]; activation) = act(X @ W + B), X of any rank
SPEC = OpSpec("FusedGemmAct", ID, ("X", "W", "B"), {"activation": str},
              lambda x, w, b, **a: reference.gemm_act(x, w, b, activation_kind=a["activation"]))


# ------------------------------------------------------------------------------------------------
# native kernels: the float32 GEMM (custom_ops/native/ops/gemm.py), and FusedGemmActBf16 (AMX bf16 tiles,
# float32 accumulation; custom_ops/native/ops/gemm_bf16.py), offered where the (possibly overridden) CPU
# features have amx-tile + amx-bf16 and chosen only under the bf16 precision opt-in and where this
# process may use AMX. It ranks above every float32 kernel (`python tools/amx_bench.py`: AMX GEMM
# against stock ORT's), except for small weights, where its fixed cost (tile configuration, the X
# conversion pass, two block passes) outweighs its speed (same command, small K x N).
# ------------------------------------------------------------------------------------------------
AMX_OP = "FusedGemmActBf16"
AMX_MIN_WEIGHTS = 256 * 256


def amx_misfit(m: Match) -> str:
    """Why the AMX kernel does not suit a FusedGemmAct match ("" when it does): its W must be a 2-D
    initializer the rewriter writes (packed once per kernel) of at least AMX_MIN_WEIGHTS elements."""
    w = next((t for t in m.initializers if t.name == m.inputs[1]), None)
    if w is None or len(w.dims) != 2:
        return f"{AMX_OP} needs W as a 2-D initializer"
    if w.dims[0] * w.dims[1] < AMX_MIN_WEIGHTS:
        return f"{AMX_OP}: W of {w.dims[0]}x{w.dims[1]} is below {AMX_MIN_WEIGHTS} weights, where AMX loses"
    return ""


NATIVE = (
    NativeKernel("FusedGemmAct"),
    NativeKernel("FusedGemmAct", AMX_OP, precision="bf16", isa="amx", cpu_features=("amx-tile", "amx-bf16"),
                 priority=40, misfit=amx_misfit),
)


# ------------------------------------------------------------------------------------------------
# lowering forms. com.microsoft:FusedGemm(A, B, C) = act(A @ B + C) with A, B 2-D;
# com.microsoft:BiasGelu(A, b) = gelu(A + b) (erf), b 1-D of A's last dimension;
# com.microsoft:FastGelu(X, b) = gelu_tanh(X + b).
# ------------------------------------------------------------------------------------------------
# Gemm | 2-D MatMul+Add -> Relu   ->   com.microsoft:FusedGemm(X, W', b'; Relu)
def lower_fusedgemm(m: Match, ctx: Context) -> Lowered | str:
    """relu(X @ W + b) as one FusedGemm; X must be known to be 2-D."""
    if m.attrs["activation"] != "relu":
        return f"FusedGemm is lowered for relu only, not '{m.attrs['activation']}'"
    shape = ctx.shape(m.inputs[0])
    if shape is None or len(shape) != 2:
        return f"FusedGemm takes a 2-D input; '{m.inputs[0]}' has shape {shape}"
    return Lowered([node("FusedGemm", m.inputs[:3], [m.output], domain=MS_DOMAIN, activation="Relu")])


def _matmul_then(op: str, kind: str):
    def build(m: Match, ctx: Context) -> Lowered | str:
        if m.attrs["activation"] != kind:
            return f"MatMul -> {op} lowers '{kind}' only, not '{m.attrs['activation']}'"
        h = ctx.fresh("matmul")
        return Lowered([node("MatMul", m.inputs[:2], [h]), node(op, [h, m.inputs[2]], [m.output], domain=MS_DOMAIN)])
    build.__doc__ = f"{kind}(X @ W + b) as MatMul then com.microsoft:{op}(h, b) (bias added inside)."
    return build


# MatMul|Gemm + Add(bias) -> erf-Gelu   ->   MatMul -> com.microsoft:BiasGelu(h, b')
lower_matmul_biasgelu = _matmul_then("BiasGelu", "gelu")
# MatMul|Gemm + Add(bias) -> tanh-Gelu   ->   MatMul -> com.microsoft:FastGelu(h, b')
lower_matmul_fastgelu = _matmul_then("FastGelu", "gelu_tanh")


# MatMul|Gemm + Add(bias) -> any epilogue   ->   MatMul -> Add -> ORT epilogue ops
def lower_matmul_add_act(m: Match, ctx: Context) -> Lowered | str:
    """act(X @ W + b) as MatMul, Add, then the epilogue in ORT ops (Relu, com.microsoft Gelu /
    FastGelu, Sigmoid -> Mul), any rank of X."""
    if not m.attrs["activation"]:
        return "no epilogue to lower"
    h, s = ctx.fresh("matmul"), ctx.fresh("biased")
    first = [node("MatMul", m.inputs[:2], [h]), node("Add", [h, m.inputs[2]], [s])]
    return then(first, epilogue(m.attrs["activation"], s, m.output, ctx))


# Priorities, from `python tools/lowering_bench.py` on the zoo's GEMMs (mlp_gemm_relu_gelu at batch 1
# and 64, bert_encoder): every lowered form ranks above the native float32 GEMM, which is behind the
# best lowered form at batch 1 and far behind at batch 64.
# - Relu: FusedGemm and MatMul + Add + Relu tie; FusedGemm is one node (2-D input only).
# - erf Gelu: MatMul + Add + Gelu (ORT makes Gemm + Gelu of it) is ahead of MatMul + BiasGelu.
# - tanh Gelu: MatMul + Add + FastGelu and MatMul + FastGelu(bias) tie.
# - Relu then Gelu: one form; relu+gelu_tanh (no zoo instance) is ranked like relu+gelu, unmeasured.
LOWERING = (
    LoweringForm("fusedgemm", "FusedGemmAct", "com.microsoft:FusedGemm", lower_fusedgemm, {"relu": 30}),
    LoweringForm("matmul_biasgelu", "FusedGemmAct", "MatMul + com.microsoft:BiasGelu", lower_matmul_biasgelu,
                 {"gelu": 25}),
    LoweringForm("matmul_fastgelu", "FusedGemmAct", "MatMul + com.microsoft:FastGelu", lower_matmul_fastgelu,
                 {"gelu_tanh": 25}),
    LoweringForm("matmul_add_act", "FusedGemmAct", "MatMul + Add + epilogue ops", lower_matmul_add_act,
                 {"relu": 25, "gelu": 30, "gelu_tanh": 30, "relu+gelu": 30, "relu+gelu_tanh": 30}),
)


# ------------------------------------------------------------------------------------------------
# examples
# ------------------------------------------------------------------------------------------------
def _matmul_add_relu(sum_is_output: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
             helper.make_node("Add", ["h", "b"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    return model(nodes, {"x": [2, 5, 8]}, ["y", "s"] if sum_is_output else ["y"],
                 {"w": weights([8, 16]), "b": weights([16], seed=1)})


def _gemm_gelu(trans_a: int = 0) -> onnx.ModelProto:
    """Gemm(transB) -> Gelu written as exporters decompose it: 0.5 * x * (1 + Erf(x / sqrt 2))."""
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["h"], name="gemm", transA=trans_a, transB=1, alpha=0.5),
             helper.make_node("Div", ["h", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["p"], name="plus1"),
             helper.make_node("Mul", ["h", "p"], ["q"], name="mul"),
             helper.make_node("Mul", ["q", "half"], ["y"], name="half_mul")]
    constants = {"w": weights([6, 8]), "c": weights([6], seed=1), "sqrt2": np.float32(SQRT2),
                 "one": np.float32(1.0), "half": np.float32(0.5)}
    return model(nodes, {"x": [8, 3] if trans_a else [3, 8]}, ["y"], constants)


RULE = PatternRule(
    anchor=Anchor("Gemm", "MatMul"),
    id=ID, order=30, matcher=match, specs=(SPEC,), native=NATIVE, lowering=LOWERING,
    examples=(
        Example("matmul_add_relu_3d", _matmul_add_relu),
        Example("gemm_transb_gelu_erf", _gemm_gelu),
        Example("gemm_trans_a", lambda: _gemm_gelu(trans_a=1), reason="Gemm transA=1 is not supported"),
        Example("sum_is_a_graph_output", lambda: _matmul_add_relu(sum_is_output=True),
                reason="intermediate tensor 's' is a graph output"),
    ),
)
