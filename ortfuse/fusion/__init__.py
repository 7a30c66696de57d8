"""The fusion pipeline (``rewrite.fuse``: match -> legality -> kernel -> keep policy -> naming ->
apply) and what it runs on: the rules (``rules/``, one module per pattern id, built from ``rulekit/``),
the catalogue derived from them, and the report of what was decided."""
