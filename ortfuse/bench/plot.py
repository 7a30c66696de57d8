"""``ortfuse bench --plot``: one PNG, a latency histogram per configuration, on shared axes; and
``require_matplotlib`` for every command that plots.

One row per (model, batch), one column per configuration. Within a row all histograms share the x
axis (latency, ms) and the bins, and all share the y axis (fraction of runs), so the shapes compare
directly; the dashed line is the configuration's p50. matplotlib is imported lazily (it is the
optional extra ``ortfuse[plot]``).
"""

from __future__ import annotations

import numpy as np


def require_matplotlib():
    """Import matplotlib with a non-interactive backend, or raise RuntimeError saying how to get it."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError(
            "--plot needs matplotlib, which is not installed: pip install 'ortfuse[plot]' (or matplotlib)"
        ) from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot(doc: dict, path: str) -> None:
    """Write the histograms of every result in ``doc`` (the dict returned by ``bench``) to ``path``."""
    plt = require_matplotlib()
    results = doc["results"]
    if not results:
        raise ValueError("nothing to plot: the bench produced no results")
    ncols = max(len(r["configs"]) for r in results)
    nrows = len(results)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.6 * nrows), squeeze=False, sharey=True)
    for i, res in enumerate(results):
        pooled = {
            name: np.concatenate([np.asarray(rep, dtype=float) for rep in row["latencies_ms"]])
            for name, row in res["configs"].items()
        }
        everything = np.concatenate(list(pooled.values()))
        lo, hi = np.percentile(everything, [0.5, 99.5])  # a few far outliers must not squash the rest
        if hi <= lo:
            lo, hi = lo * 0.95, hi * 1.05 + 1e-6
        log = lo > 0 and hi / lo > 4  # configurations orders of magnitude apart: log axis
        bins = np.geomspace(lo, hi, 41) if log else np.linspace(lo, hi, 41)
        for j in range(ncols):
            ax = axes[i][j]
            if j >= len(pooled):
                ax.axis("off")
                continue
            name = list(pooled)[j]
            x = pooled[name]
            clipped = np.clip(x, lo, hi)
            ax.hist(clipped, bins=bins, weights=np.full(len(x), 1.0 / len(x)), color=f"C{j}", alpha=0.85)
            row = res["configs"][name]
            ax.axvline(row["p50_ms"], color="k", linestyle="--", linewidth=1)
            ratio = row.get("ratio")
            sub = f"p50 {row['p50_ms']:.3g} ms" + (f", x{ratio:.3f}" if ratio is not None else "")
            ax.set_title(f"{name}\n{sub}", fontsize=8)
            if log:
                from matplotlib.ticker import (
                    FormatStrFormatter,
                    LogLocator,
                    NullFormatter,
                )

                ax.set_xscale("log")
                ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
                ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
                ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlim(lo, hi)
            ax.tick_params(labelsize=7)
            ax.set_xlabel("latency (ms)", fontsize=7)
            if j == 0:
                ax.set_ylabel(f"{res['model']} b={res['batch']}\nfraction of runs", fontsize=8)
    env = doc.get("environment", {})
    prot = doc.get("protocol", {})
    fig.suptitle(
        f"ortfuse bench: {env.get('cpu_model', '?')}, {env.get('logical_cores', '?')} cores; "
        f"{prot.get('repeats', '?')} repeats, interleaved single runs; outliers beyond the 0.5-99.5 % range clipped",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
