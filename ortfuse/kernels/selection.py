"""The kernel of one match: the registry's candidates for its op, dtype and epilogue, each checked
against the match (a native kernel's rank limit, attributes and misfit; a lowering form's build),
the first that fits chosen (docs/ARCHITECTURE.md §5)."""

from __future__ import annotations

from ortfuse.custom_ops.registration import native_node_attrs
from ortfuse.fusion import catalogue
from ortfuse.fusion.rulekit.lowering import Context
from ortfuse.fusion.rulekit.result import Lowered, Match
from ortfuse.ir.graph import GraphIndex
from ortfuse.kernels import registry


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
    ctx = Context(ix.opset, lambda hint: ix.unique_name(f"{m.output}/{hint}"), ix.shape)
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

    selection = registry.select(m.op, m.dtype, prefer=prefer, variant=m.attrs.get("activation", ""), fits=fits,
                                precision=precision)
    return selection, built.get(selection.kernel) if selection.kernel is not None else None
