"""Tools on a plan: drawings and timelines, the largest batch or depth that fits."""
