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
    ``ModelArgError`` for a malformed ``--dim``."""
    from ortfuse.ir import feeds, model_args

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
