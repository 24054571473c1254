"""The strategies, one per policy: each takes an Analysis and a budget, returns a Choice."""
