"""What a native op declares: ``NativeOpDef`` (name, inputs, compute, worker, attributes, types) and
``AttrDef`` (one attribute read in CreateKernelV2 into the kernel state). Plain Python, no numba:
the functions named here are compiled on first registration (``install.ensure_registered``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ortfuse.custom_ops import abi
from ortfuse.custom_ops.native.words import ATTR_KINDS, MAX_ATTR_WORDS, STRING_ATTR_CAP


@dataclass(frozen=True)
class AttrDef:
    """An attribute read in CreateKernel into attribute word ``slot`` of the kernel state.

    kind: "float" | "int" | "choice" (a string of '+'-joined tokens from ``choices``; it takes
    ``1 + max_steps`` words: the count, then each token's index) | "ints" | "floats" (up to
    ``max_steps`` values, stored like a choice: count, then values). A missing optional attribute
    takes ``default`` (a missing ``choice``, ``ints`` or ``floats`` gives zero values)."""

    name: str
    kind: str
    slot: int
    required: bool = True
    default: float = 0
    choices: tuple[str, ...] = ()
    max_steps: int = 1

    def words(self) -> int:
        return 1 + self.max_steps if self.kind in ("choice", "ints", "floats") else 1


@dataclass(frozen=True)
class NativeOpDef:
    """A native op.

    ``compute`` is a plain function ``(kernel, ctx) -> OrtStatus*`` (int64 addresses) compiled with
    ``cfunc(ort_api.SIG_KERNEL_COMPUTE_V2, cache=True)``; ops of one family share it (compiled once).
    ``worker`` is a plain function ``(args, block) -> None`` compiled with ``ort_api.SIG_WORKER``: the
    math of one block, found by ``threads.run_blocks`` through the record. Both compile on first registration.
    """

    name: str
    inputs: tuple[str, ...]
    compute: Callable
    worker: Callable | None = None
    attrs: tuple[AttrDef, ...] = ()
    n_outputs: int = 1
    input_type: int = abi.ONNX_TYPE_FLOAT      # ONNX_TYPE_UNDEFINED: any type (the kernel checks)
    output_type: int = abi.ONNX_TYPE_FLOAT
    node_attrs: Callable | None = None
    """``node_attrs(spec_attrs) -> dict``: the attributes this kernel reads, made by the rewriter from
    the match's spec attributes when it picks this kernel (ValueError: this kernel cannot run it)."""
    min_level: str = "generic"
    """The lowest ISA level (``foundation.isa.ISA_LEVELS``) whose ops library holds this op: one whose
    instructions no CPU below that level has (AMX tiles come only with AVX-512) is not compiled into
    lower levels' libraries."""

    def __post_init__(self):
        used = set()
        for a in self.attrs:
            if a.kind not in ATTR_KINDS:
                raise ValueError(f"{self.name}: attribute {a.name!r} has unknown kind {a.kind!r}")
            if a.kind in ("ints", "floats") and 8 * a.max_steps > STRING_ATTR_CAP:
                raise ValueError(f"{self.name}: attribute {a.name!r} may hold at most {STRING_ATTR_CAP // 8} values")
            words = set(range(a.slot, a.slot + a.words()))
            if words & used or a.slot < 0 or a.slot + a.words() > MAX_ATTR_WORDS:
                raise ValueError(f"{self.name}: attribute {a.name!r} overlaps another or leaves the slot")
            used |= words
        if self.name.endswith("Ref"):
            raise ValueError(f"{self.name}: names ending in 'Ref' belong to the Python-op path")
