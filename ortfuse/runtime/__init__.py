"""What a session needs at load time besides fusion: plan cache, cache paths, session-options keys."""
