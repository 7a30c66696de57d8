"""What the commands that run a model share: the arguments that make its inputs (``--inputs``,
``--dim``), those inputs, checked on stock ORT, and the patterns to fuse by default."""

from __future__ import annotations

from ortfuse.ir.feeds import DEFAULT_DIM


def add_input_arguments(p, what: str = "random inputs") -> None:
    """``--inputs DATA.npz`` and ``--dim NAME=VALUE``, as every command that makes inputs takes them."""
    p.add_argument("--inputs", metavar="DATA.npz",
                   help="input arrays by input name (default: seeded sample data the model can take)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                   help=f"size of a named dynamic dim for the {what}, repeatable (dims not named: the first "
                        f"is the batch, others {DEFAULT_DIM})")


def command_inputs(model, args, batch: int = 1, seed: int = 0):
    """The ``ortfuse.ir.feeds.CommandFeeds`` of ``args.inputs`` / ``args.dim`` for ``model``, run once on
    stock ORT: ``FeedError`` (or ``SampleRejected``, with the fix) as one sentence otherwise;
    ``ModelArgError`` for a malformed ``--dim``. A public model named by ``args.model`` without
    ``--inputs`` or ``--dim`` takes sample data at its pinned input shape (its dims have no names)."""
    from ortfuse.ir import feeds, model_args
    from ortfuse.models import public

    if getattr(args, "model", None) in public.NAMES and not args.inputs and not args.dim:
        arrays = public.sample_inputs(args.model, batch, seed)
        shapes = ", ".join(f"{k} {'x'.join(map(str, v.shape))}" for k, v in arrays.items())
        made = feeds.CommandFeeds(arrays, None, f"random, seed {seed}; the public model's pinned shape: {shapes}")
    else:
        made = feeds.command_feeds(model, args.inputs, model_args.parse_dims(args.dim), batch, seed)
    feeds.check_feeds(model, made.feeds, made.npz)
    return made


def default_patterns(model, patterns: list[str] | None):
    """``--patterns`` split on commas; else the model's annotated ids (as ``fusion=True`` uses them)."""
    from ortfuse.ir import metadata

    if patterns:
        return [p.strip() for item in patterns for p in item.split(",") if p.strip()]
    try:
        return metadata.parse_request(metadata.read_props(model)).patterns
    except metadata.MetadataError:
        return None
