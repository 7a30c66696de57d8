"""The kernel of one match: the registry's candidates for its op, dtype and epilogue, each checked
against the match (a native kernel's rank limit, attributes and misfit; a lowering form's build),
the first that fits chosen (docs/ARCHITECTURE.md §5). Without a preference, the order measured on
this machine (``ortfuse.kernel_choice.ranking``) comes first, the registry's static priorities after it;
a measured order that puts ORT first leaves the match to ORT (``LEFT_TO_ORT``)."""

from __future__ import annotations

from ortfuse.custom_ops.registration import native_node_attrs
from ortfuse.fusion import catalogue
from ortfuse.fusion.rulekit.lowering import Context
from ortfuse.fusion.rulekit.result import Lowered, Match
from ortfuse.ir.graph import GraphIndex
from ortfuse.kernel_choice import ranking, registry


def lower(form: str, m: Match, ctx: Context) -> Lowered | str:
    """The nodes of lowering form ``form`` for ``m``, or the reason the form does not apply."""
    rule = catalogue.LOWERING_FORMS[form]
    if m.op != rule.op:
        return f"rule {form} lowers {rule.op}, not {m.op}"
    kind = m.attrs.get("activation", "")
    if kind not in rule.priorities:
        return f"rule {form} does not lower the epilogue '{kind}'"
    return rule.build(m, ctx)


def choose_kernel(ix: GraphIndex, m: Match, prefer: str | None,
                  precision: str = registry.FP32) -> tuple[registry.Selection, Lowered | None]:
    """The registry's kernel for ``m`` and, for a lowered kernel, its nodes (else None)."""
    native = frozenset() if prefer in (registry.LOWERED_ONLY, registry.NO_NATIVE) else registry._native_ops()
    ctx = Context(ix.opset, lambda hint: ix.unique_name(f"{m.output}/{hint}"), ix.shape, native)
    built: dict[registry.Kernel, Lowered] = {}

    def fits(kernel: registry.Kernel) -> str:
        if kernel.path == registry.NATIVE:  # a native kernel would fail at run time where ORT runs
            rank, name = max(((len(ix.shape(t) or ()), t) for t in [*m.inputs, m.output] if t), default=(0, ""))
            if rank > registry.NATIVE_MAX_RANK:
                return f"native kernels take rank <= {registry.NATIVE_MAX_RANK}, '{name}' has rank {rank}"
            try:
                native_node_attrs(kernel.op_type, m.attrs)
            except ValueError as exc:
                return f"native {kernel.op}: {exc}"
            return kernel.misfit(m) if kernel.misfit is not None else ""
        if kernel.path != registry.LOWERED:
            return ""
        out = lower(kernel.form, m, ctx)
        if isinstance(out, str):
            return out
        built[kernel] = out
        return ""

    variant = m.attrs.get("activation", "")
    if prefer == ranking.STATIC:
        prefer = None
        tried: list[str | None] = [None]
    else:
        tried = [prefer] if prefer is not None else [*ranking.order(m.op, variant, m.dtype), None]
    for kernel_id in tried:
        if kernel_id == ranking.ORT:
            return registry.Selection(None, reason=LEFT_TO_ORT), None
        selection = registry.select(m.op, m.dtype, prefer=kernel_id, variant=variant, fits=fits, precision=precision)
        if selection.kernel is not None or kernel_id is None or prefer is not None:
            return selection, built.get(selection.kernel) if selection.kernel is not None else None
    raise AssertionError("unreachable: the static order is always tried last")


LEFT_TO_ORT = "left to ORT: unfused ran fastest in the kernel ranking measured on this machine (`ortfuse rank`)"
