"""ORT's profile trace read back (``SessionOptions.enable_profiling``, ``end_profiling()``).

Times come from events of cat ``Node`` named ``<node>_kernel_time`` (``dur`` in us,
``args.op_name``) that fall inside a counted ``model_run`` event (the first ``warmup`` runs are not
counted). A node's time is the median over counted runs of its time in each run (medians: on shared
CPUs a few disturbed runs would dominate a mean); the run time is the median ``model_run``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

KERNEL_SUFFIX = "_kernel_time"


class ProfileError(Exception):
    """A usage problem (unreadable model, bad option); the CLI prints it and exits with 2."""


@dataclass
class NodeTime:
    """One node of a profile: median time per counted run (us), and what it stands for."""

    name: str
    op_type: str
    us: float
    calls: float = 1.0  # events per counted run
    maps_to: list[str] = field(default_factory=list)  # nodes of the graph ORT was given it stands for
    how: str = ""  # how the mapping was made, or "unmapped"
    fused_op: str = ""  # fused configuration: the fused op (report's fused_node) this node belongs to
    pattern_id: str = ""
    replaced: list[str] = field(default_factory=list)  # the fused op's original nodes
    spans: list[str] = field(default_factory=list)  # fused ops a layout op does together (time not split)


@dataclass
class Profile:
    """One configuration's profile: ``run_us`` is the median ``model_run`` time, ``nodes`` hottest first;
    ``node_us`` (the sum of the nodes' medians) need not equal the median of the runs' node sums."""

    config: str
    runs: int
    warmup: int
    run_us: float
    nodes: list[NodeTime]
    kernel_run_us: float = 0.0  # median over counted runs of the run's summed node times
    trace: str = ""

    @property
    def node_us(self) -> float:
        return float(sum(n.us for n in self.nodes))

    def by_op_type(self) -> list[tuple[str, float, int]]:
        """(op type, us per run, node count), hottest first; the times sum to ``node_us``."""
        acc: dict[str, list] = {}
        for n in self.nodes:
            row = acc.setdefault(n.op_type, [0.0, 0])
            row[0] += n.us
            row[1] += 1
        return sorted(((k, v[0], v[1]) for k, v in acc.items()), key=lambda r: -r[1])


def read_trace(events: list[dict], warmup: int) -> tuple[dict[str, tuple[str, list[float], int]], int, float]:
    """Collect the node events of the counted runs of one trace.

    Returns ({node name: (op type, its us in each counted run, event count)}, counted runs,
    median model_run us)."""
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    counted = runs[warmup:]
    if not counted:
        raise ProfileError(f"the trace holds {len(runs)} run(s), none after the {warmup} warm-up run(s)")
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in counted]
    starts = np.array([w[0] for w in windows])
    per_node: dict[str, tuple[str, list[float], int]] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith(KERNEL_SUFFIX):
            continue
        i = int(np.searchsorted(starts, e["ts"], side="right")) - 1
        if i < 0 or e["ts"] > windows[i][1]:
            continue  # a warm-up run's node
        name = e["name"][: -len(KERNEL_SUFFIX)]
        if name not in per_node:
            per_node[name] = (e.get("args", {}).get("op_name", "?"), [0.0] * len(counted), 0)
        op, times, count = per_node[name]
        times[i] += float(e["dur"])
        per_node[name] = (op, times, count + 1)
    return per_node, len(counted), float(np.median([e["dur"] for e in counted]))
