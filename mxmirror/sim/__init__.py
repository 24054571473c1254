"""MXNet 1.9.1's training graph and static memory planner, simulated (no MXNet)."""
