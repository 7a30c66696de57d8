"""``ortfuse profile``'s library: ORT's own profiler on the fused and the unfused model, and where the
time goes (docs/ARCHITECTURE.md §8).

    run          the configurations, their profiled runs, the result (``profile``)
    trace        ORT's trace read back: each node's median time per counted run
    names        a profiled node resolved to nodes of the graph ORT was given
    attribution  each pattern's saving, and how each profile's time splits
    openvino_counters  OpenVINO's CPU plugin in the same rounds: wall time, per-layer counters, its
                 layers mapped to the ONNX nodes and set beside ortfuse's fused ops (``--peer openvino``)
    output       the text report
    plot         the chart (matplotlib, optional)

The command line is ``ortfuse.cli.profile``.
"""
