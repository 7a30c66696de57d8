"""Fused op specifications: name, inputs, attributes and numpy reference of each fused op.

One op type per pattern. Every fused node also carries two provenance attributes,
``pattern_id`` and ``replaced_nodes`` (comma-separated names of the nodes it replaced).
Op types served by the reference (Python-op) path end in ``Ref``; native kernels use other names,
because an op name registered on both paths hangs onnxruntime-extensions (DESIGN.md §4).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ortfuse.custom_ops import reference

DOMAIN = "ai.onnx.contrib"
PROVENANCE_ATTRS = {"pattern_id": str, "replaced_nodes": str}
MAX_CHAIN_OPERANDS = 4


@dataclass(frozen=True)
class OpSpec:
    """A fused op: ``inputs`` are float32 tensors; ``attrs`` maps attribute name to int/float/str."""

    name: str
    pattern_id: str
    inputs: tuple[str, ...]
    attrs: dict[str, type] = field(default_factory=dict)
    reference: Callable = None

    @property
    def ref_op_type(self) -> str:
        return self.name + "Ref"

    def all_attrs(self) -> dict[str, type]:
        return {**self.attrs, **PROVENANCE_ATTRS}


def _conv_ref(x, w, b, **a):
    return reference.conv_act(x, w, b, strides=a["strides"], pads=a["pads"], dilations=a["dilations"],
                              group=a["group"], activation_kind=a["activation"], alpha=a["alpha"], beta=a["beta"])


def _conv_add_ref(x, w, b, r, **a):
    return reference.conv_act(x, w, b, strides=a["strides"], pads=a["pads"], dilations=a["dilations"],
                              group=a["group"], activation_kind=a["activation"], alpha=0.0, beta=0.0, residual=r)


_CONV_ATTRS = {"strides": str, "pads": str, "dilations": str, "group": int, "activation": str}

SPECS: dict[str, OpSpec] = {}


def _add(spec: OpSpec) -> None:
    SPECS[spec.name] = spec


_add(OpSpec("FusedConvAct", "conv_bn_relu", ("X", "W", "B"), {**_CONV_ATTRS, "alpha": float, "beta": float}, _conv_ref))
_add(OpSpec("FusedConvAddAct", "conv_add_relu", ("X", "W", "B", "R"), _CONV_ATTRS, _conv_add_ref))
_add(OpSpec("FusedGemmAct", "gemm_relu_gelu", ("X", "W", "B"), {"activation": str},
            lambda x, w, b, **a: reference.gemm_act(x, w, b, activation_kind=a["activation"])))
_add(OpSpec("FusedAddRelu", "add_relu", ("A", "B"), {}, lambda a, b, **_: reference.add_relu(a, b)))
_add(OpSpec("FusedHardSwish", "hardswish", ("X",), {"add": float, "lo": float, "hi": float, "div": float},
            lambda x, **a: reference.hardswish(x, add=a["add"], lo=a["lo"], hi=a["hi"], div=a["div"])))
_add(OpSpec("FusedSiLU", "silu", ("X",), {}, lambda x, **_: reference.silu(x)))
for _k in range(MAX_CHAIN_OPERANDS + 1):
    _add(OpSpec(f"FusedEltwiseChain{_k}", "eltwise_chain", ("X",) + tuple(f"C{i}" for i in range(_k)),
                {"program": str}, lambda x, *ops, **a: reference.eltwise_chain(x, *ops, program=a["program"])))


# float16 native op types (custom_ops/native_f16.py): the spec's math on float16 tensors, computed in
# float32 and rounded once (round to nearest even) per output element
FLOAT16_NATIVE = {"FusedAddRelu": "FusedAddReluF16", "FusedHardSwish": "FusedHardSwishF16",
                  "FusedSiLU": "FusedSiLUF16"}
# native op types that serve a spec under another numeric contract (custom_ops/native_amx.py) or dtype
NATIVE_VARIANTS = {"FusedGemmActBf16": "FusedGemmAct", **{v: k for k, v in FLOAT16_NATIVE.items()}}


def spec_for_op_type(op_type: str) -> OpSpec | None:
    """The spec of a fused node's op type (reference, native or native-variant name), or None if not ours."""
    base = op_type[:-3] if op_type.endswith("Ref") else NATIVE_VARIANTS.get(op_type, op_type)
    return SPECS.get(base)
