"""The segment model: a graph cut into a chain of segments, their schedule and cost."""
