"""The fusion rules: one module per pattern id, named after it, each declaring
``RULE = PatternRule(...)`` (``ortfuse.fusion.rulekit.contract``); ``ortfuse.fusion.catalogue`` finds
them with pkgutil and derives every table from them (docs/ARCHITECTURE.md §4).

A rule module declares:

- ``id`` (the module's name) and ``order`` (priority, lower first: an earlier pattern claims nodes
  first; the generic eltwise_chain is last);
- a ``# before -> after`` comment above its ``matcher(ix, anchor) -> Match | Reject(reason) | None``;
- ``specs``: the fused op(s) its matches name, each an ``OpSpec`` (inputs, attributes, numpy
  reference; shared math lives in ``ortfuse.custom_ops.reference``);
- ``native``: the native op types that compute them (``NativeKernel``: the spec's own name for
  float32, variants for float16 or bf16 products), each registered by a native op family in
  ``ortfuse.custom_ops``;
- ``lowering``: its lowering forms (``LoweringForm``: ORT ops, with a priority per epilogue,
  measured with ``python tools/lowering_bench.py``; the decision is stated beside them);
- ``examples``: small graphs, matching and near-miss with the expected reason, which
  tests/test_rules.py runs for every rule;
- ``explains_near_misses`` and ``yields_to_ort`` where the defaults do not fit.

A rule module imports only ``ortfuse.ir``, ``ortfuse.fusion.rulekit`` and the low levels of
``ortfuse.custom_ops`` (specs, reference), never another rule module. Adding a pattern is adding
its module here, the native kernel it names (if any) and its tests.
"""
