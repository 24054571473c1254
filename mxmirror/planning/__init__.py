"""Planning: the analysed graph, one strategy per file, the budget front, the cache."""
