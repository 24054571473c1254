"""Metadata lives in setup.cfg; this file installs mxmirror-startup.pth next to the package
in site-packages (see mxmirror/startup.py), for normal and editable installs, and builds the
compiled memory planner and multi-level DP table (mxmirror/sim/_planner.c,
mxmirror/planning/_dp.c: C with Python's own headers, no other library)."""

import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel  # 64+, as pyproject.toml asks

PTH = Path(__file__).resolve().parent / "mxmirror-startup.pth"


class BuildPyWithPth(build_py):
    """A wheel's build folder becomes site-packages: the .pth goes beside the package."""

    def run(self):
        super().run()
        if not self.editable_mode:  # the editable wheel gets it below
            shutil.copy(PTH, Path(self.build_lib) / PTH.name)


class EditableWheelWithPth(editable_wheel):
    """`pip install -e`: the folder copied into the editable wheel as it is (besides the
    dist-info) is the one namespace-package .pth files go to: ours goes there too."""

    def _install_namespaces(self, installation_dir, pth_prefix):
        super()._install_namespaces(installation_dir, pth_prefix)
        shutil.copy(PTH, Path(installation_dir) / PTH.name)


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth},
      ext_modules=[Extension(name, [path], extra_compile_args=["-O3"]) for name, path in (
          ("mxmirror.sim._planner", "mxmirror/sim/_planner.c"),
          ("mxmirror.planning._dp", "mxmirror/planning/_dp.c"))])
