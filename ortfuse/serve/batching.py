"""Dynamic batching of requests for one run: which models batch, which requests run together, and
the split of the batch's outputs back to its requests (numpy only; the Ray side is ``replica``).

A model batches when every input's first dim is dynamic and the same one (one name, or unnamed), and
every output's first dim is dynamic: then the concatenation of requests along dim 0 is one valid
input, and output row ``r`` belongs to the request that gave input row ``r`` (a model whose outputs
mix rows across the batch would break that; ``split`` refuses outputs whose first dim is not the
batch's, and the replica then runs those requests one by one). Requests run together only when
they agree on everything but the first dim: input names, dtypes and the other dims.
"""

from __future__ import annotations

import numpy as np

from ortfuse.serve.signature import Signature

Feeds = dict[str, np.ndarray]


def batchable(signature: Signature) -> bool:
    """Whether requests of this model may be concatenated along dim 0 (module docstring)."""
    if not signature.inputs or not signature.outputs:
        return False
    firsts = {spec.shape[0] if spec.shape else 0 for spec in signature.inputs}
    if len(firsts) != 1 or isinstance(next(iter(firsts)), int):
        return False
    return all(spec.shape and not isinstance(spec.shape[0], int) for spec in signature.outputs)


def key(feeds: Feeds) -> tuple:
    """What requests run together must share: names, dtypes and every dim but the first."""
    return tuple((name, a.dtype.str, a.shape[1:]) for name, a in sorted(feeds.items()))


def rows(feeds: Feeds) -> int:
    """The request's batch size (its inputs' first dim, equal across the requests ``groups`` joins)."""
    return next(iter(feeds.values())).shape[0]


def groups(requests: list[Feeds]) -> list[list[int]]:
    """Indices of ``requests`` grouped by ``key``, in order of first appearance; a request whose inputs
    differ in their first dim (ORT does not hold dim names to one value) is a group of its own."""
    by_key: dict[tuple, list[int]] = {}
    for index, feeds in enumerate(requests):
        alone = len({a.shape[0] if a.ndim else None for a in feeds.values()}) > 1
        by_key.setdefault(("alone", index) if alone else key(feeds), []).append(index)
    return list(by_key.values())


def concat(requests: list[Feeds]) -> Feeds:
    """One input of all ``requests`` (same ``key``), rows in request order."""
    return {name: np.concatenate([feeds[name] for feeds in requests]) for name in requests[0]}


def split(outputs: list[np.ndarray], sizes: list[int]) -> list[list[np.ndarray]] | None:
    """Each request's rows of the batch's ``outputs``; None when an output's first dim is not the batch's."""
    total = sum(sizes)
    if any(out.ndim == 0 or out.shape[0] != total for out in outputs):
        return None
    bounds = np.cumsum([0, *sizes])
    return [[out[start:end] for out in outputs] for start, end in zip(bounds[:-1], bounds[1:])]
