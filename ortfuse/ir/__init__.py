"""The model as ortfuse reads it: graph links and index, the graph-editing helper, metadata contract,
model arguments, sample feeds."""
