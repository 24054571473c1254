"""mxmirror: sublinear-memory training plans for MXNet 1.9.1 symbolic executors."""

from mxmirror.api import plan
from mxmirror.errors import PlanError
from mxmirror.frontends.hook import disable, enable, enable_from_env, enabled, simple_bind
from mxmirror.runtime.plan import Plan

__all__ = ["Plan", "PlanError", "disable", "enable", "enabled", "plan", "simple_bind"]
__version__ = "0.1.0"

enable_from_env()
