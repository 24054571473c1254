"""mxmirror: sublinear-memory training plans for MXNet 1.9.1 symbolic executors."""

from .errors import PlanError

__all__ = ["PlanError"]
__version__ = "0.1.0"
