"""A tuned plan's outputs against stock ORT's on the recorded feeds, before a live swap
(docs/ARCHITECTURE.md §7). Per output: same shape, and ``|got - want| <= atol * max(1, max|want|) +
rtol * |want|`` elementwise (NaN where stock has NaN); float32 ``CHECK_*``, under the bf16 precision
opt-in ``BF16_PLAN_*``. Non-tensor outputs (sequences, maps) are not compared.

The tolerances of every check of fused outputs against stock ORT are defined here, the tuner's check of
one match on its own subgraph (``ortfuse.tune.measure``) included."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ortfuse.foundation import yielding
from ortfuse.foundation.messages import one_sentence
from ortfuse.foundation.session_options import PRECISION_OPTION, config_entry

# float32 kernels, a match's subgraph (atol as it is) and a whole plan (atol times max(1, max|want|))
CHECK_RTOL, CHECK_ATOL = 1e-3, 1e-4
# bf16 products (the ortfuse.precision opt-in): each product's relative error is up to 2^-7, so
# |error| <~ 2^-7 sum|x w| (tests/test_amx.py). One match is checked at its own outputs, a plan at the
# model's outputs, which its bf16 GEMMs reach one after another, each adding its error: the plan's
# tolerance is twice the match's. atol times max(1, max|want|) in both.
BF16_MATCH_RTOL, BF16_MATCH_ATOL = 2.0**-5, 2.0**-6
BF16_PLAN_RTOL, BF16_PLAN_ATOL = 2.0**-4, 2.0**-5


def differing_output(names: Sequence[str], want: Sequence, got: Sequence, bf16: bool) -> str | None:
    """The name of the first output of ``got`` outside the tolerance of ``want``'s, or None."""
    rtol, atol = (BF16_PLAN_RTOL, BF16_PLAN_ATOL) if bf16 else (CHECK_RTOL, CHECK_ATOL)
    for name, w, g in zip(names, want, got):
        if not isinstance(w, np.ndarray):
            continue
        scale = float(np.abs(w).max()) if w.size and w.dtype.kind in "fc" else 1.0
        if w.shape != np.shape(g) or not np.allclose(g, w, rtol=rtol, atol=atol * max(1.0, scale), equal_nan=True):
            return name
    return None


def check_plan(stock: Callable[[dict], Sequence], fused: Callable[[dict], Sequence], feeds: Sequence[dict],
               names: Sequence[str], bf16: bool) -> str:
    """"" when ``fused(feed)`` computes what ``stock(feed)`` does on every feed, else one sentence
    saying which served feed failed or differed (stock ORT is kept)."""
    rtol = BF16_PLAN_RTOL if bf16 else CHECK_RTOL
    for i, feed in enumerate(feeds):
        want = stock(feed)
        try:
            got = fused(feed)
        except Exception as exc:
            return f"the fused plan failed on served feed {i + 1} ({one_sentence(exc)}); kept stock ORT"
        name = differing_output(names, want, got, bf16)
        if name is not None:
            return (f"the fused plan's output {name!r} differs from stock ORT's on served feed {i + 1} beyond rtol "
                    f"{rtol:g}; kept stock ORT (run `ortfuse verify`)")
    return ""


def check_sessions(stock, fused, feeds: Sequence[dict], names: Sequence[str], sess_options) -> str:
    """``check_plan`` of two ORT sessions (Python or C sessions: ``run(names, feed, run_options)``),
    each run a tuning run that yields to served runs (``yielding.run``); the bf16 tolerance under the
    ``ortfuse.precision`` opt-in of ``sess_options``."""
    bf16 = config_entry(sess_options, PRECISION_OPTION).lower() == "bf16"
    return check_plan(lambda feed: yielding.run(lambda options: stock.run(names, feed, options)),
                      lambda feed: yielding.run(lambda options: fused.run(names, feed, options)), feeds, names, bf16)
