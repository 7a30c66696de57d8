"""The parts a pattern rule (a module of ``ortfuse.fusion.rules``) is built from: the rule contract,
match results, legality checks, epilogue matchers, the conv core and ORT-node blocks for lowerings."""
