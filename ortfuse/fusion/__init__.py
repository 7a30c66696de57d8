"""The fusion pipeline: match (patterns) -> legality -> rewrite, and the report of what was decided."""
