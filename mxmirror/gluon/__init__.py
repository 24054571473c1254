"""Gluon: hybridized blocks trained through a plan (``PlannedBlock``), and the hook that
plans unchanged Gluon scripts under ``mxmirror run`` / ``enabled()``."""

from mxmirror.gluon.block import PlannedBlock
from mxmirror.gluon.hook import install

__all__ = ["PlannedBlock", "install"]
