"""Activation epilogues as exporters write them, matched from their input tensor ``x``.

Each matcher returns an ``Epilogue`` (the nodes, the output tensor, the kind and its parameters in
the terms of ``custom_ops.reference.activation``) or None. Constants are compared with a relative
tolerance of 1e-4 (exporters print 1.4142135 or 1.41421356...).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ortfuse.fusion.rulekit.checks import attr
from ortfuse.ir.graph import GraphIndex

SQRT2 = float(np.sqrt(2.0))
SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))


@dataclass
class Epilogue:
    kind: str
    nodes: list[onnx.NodeProto]
    output: str
    alpha: float = 0.0
    beta: float = 0.0


def _near(ix: GraphIndex, name: str, value: float) -> bool:
    return ix.is_scalar_const(name, value, rtol=1e-4)


def _consumers(ix: GraphIndex, x: str, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in ix.consumers_of(x) if n.op_type == op_type]


def clip_bounds(ix: GraphIndex, node: onnx.NodeProto) -> tuple[float, float] | None:
    """Constant (min, max) of a Clip (attributes before opset 11, inputs after), or None."""
    if ix.opset < 11:
        return float(attr(node, "min", -np.inf)), float(attr(node, "max", np.inf))
    bounds = []
    for pos, default in ((1, -np.inf), (2, np.inf)):
        if len(node.input) > pos and node.input[pos]:
            value = ix.const(node.input[pos])
            if value is None or value.size != 1:
                return None
            bounds.append(float(value.reshape(-1)[0]))
        else:
            bounds.append(default)
    return bounds[0], bounds[1]


def _times_x(ix: GraphIndex, tensor: str, x: str) -> onnx.NodeProto | None:
    node = ix.child(tensor, "Mul", domain=None)
    return node if node is not None and ix.other_input(node, tensor) == x else None


def match_product_half_x(ix: GraphIndex, start: str, x: str) -> tuple[list[onnx.NodeProto], str] | None:
    """From ``start`` = (1 + f(x)), follow the Mul nodes that make 0.5 * x * start, in any order
    (including a separate Mul(x, 0.5) feeding the last Mul). Returns (nodes, output) or None."""
    nodes: list[onnx.NodeProto] = []
    factors: set[str] = set()
    cur = start
    for _ in range(2):
        mul = ix.child(cur, "Mul", domain=None)
        if mul is None:
            return None
        other = ix.other_input(mul, cur)
        if other == x:
            factors.add("x")
        elif _near(ix, other, 0.5):
            factors.add("half")
        else:
            half_x = ix.parent(other, "Mul", domain=None)
            if (half_x is None or x not in half_x.input
                    or not _near(ix, ix.other_input(half_x, x) or "", 0.5)):
                return None
            factors |= {"x", "half"}
            nodes.append(half_x)
        nodes.append(mul)
        cur = mul.output[0]
        if factors == {"x", "half"}:
            return nodes, cur
    return None


def match_gelu_erf(ix: GraphIndex, x: str) -> Epilogue | None:
    """0.5 * x * (1 + Erf(x / sqrt2)), with Div(sqrt2) or Mul(1/sqrt2) and any Mul order."""
    for scale in _consumers(ix, x, "Div") + _consumers(ix, x, "Mul"):
        if scale.op_type == "Div":
            if scale.input[0] != x or not _near(ix, scale.input[1], SQRT2):
                continue
        elif not _near(ix, ix.other_input(scale, x) or "", 1.0 / SQRT2):
            continue
        erf = ix.child(scale.output[0], "Erf", domain=None)
        one = erf and ix.child(erf.output[0], "Add", domain=None)
        if not one or not _near(ix, ix.other_input(one, erf.output[0]), 1.0):
            continue
        tail = match_product_half_x(ix, one.output[0], x)
        if tail:
            return Epilogue("gelu", [scale, erf, one] + tail[0], tail[1])
    return None


def match_gelu_tanh(ix: GraphIndex, x: str) -> Epilogue | None:
    """0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), x^3 as Pow(x, 3) or x*x*x."""
    cubes: list[tuple[list[onnx.NodeProto], str]] = []
    for pow_node in _consumers(ix, x, "Pow"):
        if pow_node.input[0] == x and _near(ix, pow_node.input[1], 3.0):
            cubes.append(([pow_node], pow_node.output[0]))
    for sq in _consumers(ix, x, "Mul"):
        if list(sq.input) == [x, x]:
            cube = _times_x(ix, sq.output[0], x)
            if cube is not None:
                cubes.append(([sq, cube], cube.output[0]))
    for nodes, cube_out in cubes:
        scaled = ix.child(cube_out, "Mul", domain=None)
        if not scaled or not _near(ix, ix.other_input(scaled, cube_out), 0.044715):
            continue
        inner = ix.child(scaled.output[0], "Add", domain=None)
        if not inner or ix.other_input(inner, scaled.output[0]) != x:
            continue
        k = ix.child(inner.output[0], "Mul", domain=None)
        if not k or not _near(ix, ix.other_input(k, inner.output[0]), SQRT_2_OVER_PI):
            continue
        tanh = ix.child(k.output[0], "Tanh", domain=None)
        one = tanh and ix.child(tanh.output[0], "Add", domain=None)
        if not one or not _near(ix, ix.other_input(one, tanh.output[0]), 1.0):
            continue
        tail = match_product_half_x(ix, one.output[0], x)
        if tail:
            return Epilogue("gelu_tanh", nodes + [scaled, inner, k, tanh, one] + tail[0], tail[1])
    return None


def match_gelu(ix: GraphIndex, x: str) -> Epilogue | None:
    """ONNX Gelu (opset 20), or its erf or tanh decompositions."""
    op = ix.child(x, "Gelu", domain=None)
    if op is not None:
        approximate = attr(op, "approximate", b"none")
        approximate = approximate.decode(errors="replace") if isinstance(approximate, bytes) else str(approximate)
        if approximate not in ("none", "tanh"):
            return None  # ORT rejects any other value when the node runs
        return Epilogue("gelu_tanh" if approximate == "tanh" else "gelu", [op], op.output[0])
    return match_gelu_erf(ix, x) or match_gelu_tanh(ix, x)


def hardsigmoid_as_hardswish(alpha: float, beta: float) -> dict | None:
    """FusedHardSwish's parameters for x * HardSigmoid(x; alpha, beta), or None where there are none:
    x * clip(alpha x + beta, 0, 1) = x * clip(x + beta/alpha, 0, 1/alpha) / (1/alpha) needs, in
    float32, alpha > 0 with 1/alpha finite and normal and beta/alpha finite (alpha = Inf would make
    it 0/0 = NaN where ORT gives x: found by tools/fuzz_campaign.py, case seed 90001617)."""
    a = np.float32(alpha)
    with np.errstate(all="ignore"):
        inv, add = np.float32(1.0) / a, np.float32(beta) / a
    if not (a > 0 and np.isfinite(inv) and inv >= np.finfo(np.float32).tiny and np.isfinite(add)):
        return None
    return {"add": float(add), "lo": 0.0, "hi": float(inv), "div": float(inv)}


def match_hardswish(ix: GraphIndex, x: str) -> Epilogue | None:
    """x * HardSigmoid(x), the HardSwish op, or x * Clip(x + 3, 0, 6) / 6 (Div before or after Mul)."""
    op = ix.child(x, "HardSwish", domain=None)
    if op is not None:
        return Epilogue("hardswish", [op], op.output[0], 1.0 / 6.0, 0.5)
    for hs in _consumers(ix, x, "HardSigmoid"):
        mul = _times_x(ix, hs.output[0], x)
        if mul is not None:
            return Epilogue("hardswish", [hs, mul], mul.output[0], float(attr(hs, "alpha", 0.2)),
                            float(attr(hs, "beta", 0.5)))
    found = match_hardswish_decomposed(ix, x)
    if found is not None:
        nodes, out, (add, lo, hi, div) = found
        if (add, lo, hi) == (3.0, 0.0, 6.0) and div == 6.0:
            return Epilogue("hardswish", nodes, out, 1.0 / 6.0, 0.5)
    return None


def match_hardswish_decomposed(ix: GraphIndex, x: str):
    """Add(x, a) -> Clip(lo, hi) -> Div(d) -> Mul(x), or ... -> Mul(x) -> Div(d).
    Returns (nodes, output, (a, lo, hi, d)) or None."""
    for add in _consumers(ix, x, "Add"):
        other = ix.other_input(add, x)
        a = ix.const(other) if other else None
        if a is None or a.size != 1 or a.ndim > 1:
            continue
        clip = ix.child(add.output[0], "Clip", domain=None)
        bounds = clip and clip_bounds(ix, clip)
        if not bounds:
            continue
        div = ix.child(clip.output[0], "Div", domain=None)
        if div is not None and div.input[0] == clip.output[0]:
            d = ix.const(div.input[1])
            mul = _times_x(ix, div.output[0], x)
            if d is not None and d.size == 1 and d.ndim <= 1 and mul is not None:
                return [add, clip, div, mul], mul.output[0], (float(a.reshape(-1)[0]), *bounds, float(d.reshape(-1)[0]))
        mul = _times_x(ix, clip.output[0], x)
        div = mul and ix.child(mul.output[0], "Div", domain=None)
        if div is not None and div.input[0] == mul.output[0]:
            d = ix.const(div.input[1])
            if d is not None and d.size == 1 and d.ndim <= 1:
                return [add, clip, mul, div], div.output[0], (float(a.reshape(-1)[0]), *bounds, float(d.reshape(-1)[0]))
    return None


def match_silu(ix: GraphIndex, x: str) -> Epilogue | None:
    """x * Sigmoid(x)."""
    for sig in _consumers(ix, x, "Sigmoid"):
        mul = _times_x(ix, sig.output[0], x)
        if mul is not None:
            return Epilogue("silu", [sig, mul], mul.output[0])
    return None


def match_simple(ix: GraphIndex, x: str) -> Epilogue | None:
    """Relu, Clip with constant bounds, or HardSigmoid (not followed by Mul(x))."""
    node = ix.only_consumer(x)
    if node is None:
        return None
    if node.op_type == "Relu":
        return Epilogue("relu", [node], node.output[0])
    if node.op_type == "Clip":
        bounds = clip_bounds(ix, node)
        if bounds is not None:
            return Epilogue("clip", [node], node.output[0], *bounds)
    if node.op_type == "HardSigmoid":
        return Epilogue("hardsigmoid", [node], node.output[0], float(attr(node, "alpha", 0.2)),
                        float(attr(node, "beta", 0.5)))
    return None


def match_conv_activation(ix: GraphIndex, x: str) -> Epilogue | None:
    """The conv epilogues: HardSwish and SiLU first (they contain a Clip / HardSigmoid), then
    Relu | Clip | HardSigmoid."""
    return match_hardswish(ix, x) or match_silu(ix, x) or match_simple(ix, x)
