"""``ortfuse bench``: stock ORT against ortfuse on one model, by the timing protocol every ortfuse
measurement follows (``ortfuse.foundation.protocol``; docs/ARCHITECTURE.md §8).

    sessions     the configurations compared and the timed session each one makes
    inputs       the model to run (.onnx path or zoo name) and its seeded inputs
    stats        statistics, ratios, the A/A noise band and verdicts, output differences
    environment  machine, load, versions, quiet thread pools
    memory       peak memory of one configuration in a child process
    peers        the alternatives run beside stock ORT (--peer): OpenVINO's CPU plugin, ORT's transformer optimizer
    run          the comparison: sessions, checks, memory, timing -> one JSON-able dict
    output       header, tables, the JSON result file
    plot         latency histograms (matplotlib, optional)

The command line is ``ortfuse.cli.bench``.
"""
