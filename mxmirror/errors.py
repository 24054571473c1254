"""The one exception users see: a message that says what to fix, and the exit codes a
process of mxmirror's ends with."""

EXIT_BAD_INPUT = 2  # bad input: one last stderr line `mxmirror: error: ...`
EXIT_INTERRUPTED = 128 + 2  # Ctrl-C, as a process ended by SIGINT (2) reports itself


class PlanError(ValueError):
    """Raised for bad input or an impossible request (shape, dtype, budget, policy)."""


class BudgetTooSmall(PlanError):
    """A budget below the smallest planned memory a policy reaches. The command line stops
    on it; the bind hook binds the smallest plan instead (a budget is never a reason to
    train unplanned)."""
