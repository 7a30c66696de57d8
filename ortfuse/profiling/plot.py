"""The chart of ``ortfuse profile --out-dir``: time per op type per configuration (OpenVINO's layer
types beside them with ``--peer openvino``), and per pattern fused against original time (matplotlib,
optional)."""

from __future__ import annotations

import os

from ortfuse.profiling.run import FUSED, LABELS, ProfileResult


def plot(r: ProfileResult, path: str, top: int = 10) -> None:
    """A PNG: time per op type per configuration, and per pattern fused vs original time."""
    from ortfuse.bench.plot import require_matplotlib

    plt = require_matplotlib()
    att = r.attributions[0] if r.attributions else None
    fig, axes = plt.subplots(1, 2 if att and att.patterns else 1, figsize=(12, 4.5), squeeze=False)
    ax = axes[0][0]
    columns = [(LABELS[p.config], p.by_op_type()) for p in r.profiles.values()]
    if r.peer is not None:  # OpenVINO's layer types: its counters, not its wall time
        columns.append(("OpenVINO f32 (layer types, counters)", r.peer.by_layer_type()))
    types: list[str] = []
    for _, rows in columns:
        for op, _, _ in rows[:top]:
            if op not in types:
                types.append(op)
    height = 0.8 / max(len(columns), 1)
    for j, (label, rows) in enumerate(columns):
        times = {op: us for op, us, _ in rows}
        ax.barh([i + j * height for i in range(len(types))], [times.get(t, 0.0) / 1000 for t in types],
                height=height, label=label, color=f"C{j}")
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(types))])
    ax.set_yticklabels(types, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms per run")
    ax.set_title("time per op type", fontsize=9)
    ax.legend(fontsize=7)
    if att and att.patterns:
        ax = axes[0][1]
        pats = [s for s in att.patterns if s.mapped]
        xs = range(len(pats))
        ax.bar([x - 0.2 for x in xs], [s.fused_mapped_us / 1000 for s in pats], 0.4, label=LABELS[FUSED], color="C0")
        ax.bar([x + 0.2 for x in xs], [s.original_us / 1000 for s in pats], 0.4,
               label=f"original nodes, {LABELS[att.config]}", color="C1")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([s.pattern_id for s in pats], fontsize=7, rotation=20)
        ax.set_ylabel("ms per run")
        ax.set_title("per pattern (mapped fused ops)", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"ortfuse profile {os.path.basename(r.model)}: {r.runs} runs after {r.warmup} warm-up", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
