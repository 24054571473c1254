"""The one exception users see: a message that says what to fix."""


class PlanError(ValueError):
    """Raised for bad input or an impossible request (shape, dtype, budget, policy)."""
