"""MXMIRROR_POLICY for scripts that never import mxmirror.

The package installs ``mxmirror-startup.pth`` next to itself in site-packages; Python runs its
one line at every start-up. That line reads one environment variable and, only when
``MXMIRROR_POLICY`` is set, imports mxmirror, whose ``enable_from_env`` waits for the script to
import mxnet (``when_imported``) and then plans every bind. Unset, it costs one dictionary look-up.
A bad policy or budget in the environment ends the script at its ``import mxnet`` with one
``mxmirror: error:`` line and exit code 2: a run that asked for a plan never trains
unplanned without saying so.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of one module to call back after it ran.

    It stays in sys.meta_path until that module has really been executed: a mere look-up
    (``importlib.util.find_spec``, as libraries probe optional dependencies) must not use it up.
    """

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback, self.searching = name, callback, False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.searching:
            return None
        self.searching = True  # the search below must not find us again
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_then_call(module):
            run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.callback()

        spec.loader.exec_module = exec_then_call
        return spec


def when_imported(name: str, callback: Callable[[], None]) -> None:
    """Call `callback` once module `name` is imported: now if it already is."""
    if name in sys.modules:
        callback()
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))
