"""The graph IR: the forward graph, op facts and backward templates, as plain values."""
