"""The model as ortfuse reads it: graph index, metadata contract, model arguments, sample feeds."""
