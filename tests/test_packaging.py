"""What installing the package promises: the Python versions, and
``MXMIRROR_POLICY=sqrt python train.py`` for a script that never imports mxmirror.

The package installs ``mxmirror-startup.pth`` into site-packages (setup.py, for normal and
editable installs); it imports mxmirror only when MXMIRROR_POLICY is set, and mxmirror then
plans every bind once the script imports mxnet. Checked in child processes of this
interpreter, whose environment was installed as the README says (``pip install -e``).
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PTH = "mxmirror-startup.pth"

# never imports mxmirror; prints whether MXNet bound a mirrored graph
SCRIPT = """
import sys
import mxnet as mx

x = mx.sym.Variable("data")
for i in range(6):
    x = mx.sym.FullyConnected(x, num_hidden=256, name=f"fc{i}")
    x = mx.sym.BatchNorm(x, name=f"bn{i}")
    x = mx.sym.Activation(x, act_type="relu", name=f"relu{i}")
sym = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(x, num_hidden=10, name="out"), name="softmax")
mod = mx.mod.Module(sym, context=mx.cpu())
mod.bind(data_shapes=[("data", (64, 256))], label_shapes=[("softmax_label", (64,))])
ex = mod._exec_group.execs[0]
print("trained mirror=" + str("_mirror" in ex.debug_str()),
      "mxmirror_loaded=" + str("mxmirror" in sys.modules))
"""


def _run(tmp_path: Path, probe: bool = False, **env_vars: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(("import importlib.util\nassert importlib.util.find_spec('mxnet')\n"
                       if probe else "") + SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MXMIRROR_") and k != "PYTHONPATH"}
    env.update(env_vars)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)


def test_installed_pth_is_the_repository_one() -> None:
    installed = Path(sysconfig.get_paths()["purelib"]) / PTH
    assert installed.is_file(), f"{installed} missing: reinstall with pip install -e ."
    assert installed.read_text() == (ROOT / PTH).read_text(), "stale: pip install -e ."


@pytest.mark.parametrize("probe", [False, True], ids=["import", "find_spec_first"])
def test_env_policy_plans_a_script_that_never_imports_mxmirror(tmp_path, probe) -> None:
    """Also when something looks mxnet up (importlib.util.find_spec, as libraries probe
    optional dependencies) before the script imports it."""
    proc = _run(tmp_path, probe=probe, MXMIRROR_POLICY="sqrt")
    assert proc.returncode == 0, proc.stderr
    assert "mxmirror: policy=sqrt" in proc.stderr
    assert "trained mirror=True mxmirror_loaded=True" in proc.stdout


def test_env_policy_on_a_first_run(tmp_path) -> None:
    """No template kept yet: the learner starts ahead of the script's import of MXNet, and
    its own binds (and every child's) are never planned: no child learns in a child."""
    proc = _run(tmp_path, MXMIRROR_POLICY="sqrt", MXMIRROR_CACHE=str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    assert "trained mirror=True mxmirror_loaded=True" in proc.stdout
    assert list((tmp_path / "cache").glob("templates-mxnet-*/*.json"))


def test_without_the_variable_mxmirror_is_not_loaded(tmp_path) -> None:
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "trained mirror=False mxmirror_loaded=False" in proc.stdout
    assert "mxmirror" not in proc.stderr


@pytest.mark.parametrize(("env_vars", "message"), [
    ({"MXMIRROR_POLICY": "budget"}, "MXMIRROR_POLICY=budget: policy 'budget' needs a budget"),
    ({"MXMIRROR_POLICY": "sqrt", "MXMIRROR_BUDGET": "1GB"}, "policy 'sqrt' takes no budget"),
    ({"MXMIRROR_POLICY": "sqtr"}, "MXMIRROR_POLICY=sqtr: unknown policy 'sqtr'; choose from"),
    ({"MXMIRROR_POLICY": "budget", "MXMIRROR_BUDGET": "lots"},
     "MXMIRROR_POLICY=budget MXMIRROR_BUDGET=lots: budget must be a size such as 800MB"),
])
def test_bad_environment_stops_the_script(tmp_path, env_vars, message) -> None:
    """Asked for a plan it cannot make, the script ends at `import mxnet` as the command
    line does: exit code 2 and one `mxmirror: error:` line, no traceback; never an
    unplanned run with a warning."""
    proc = _run(tmp_path, **env_vars)
    assert proc.returncode == 2, proc.stderr
    assert "trained" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("mxmirror: error: ") and message in lines[-1], proc.stderr
    assert lines[-1].endswith("(or unset MXMIRROR_POLICY)")
    assert "Traceback" not in proc.stderr, proc.stderr


def test_build_puts_the_pth_beside_the_package(tmp_path) -> None:
    """A normal install (wheel) copies the build folder into site-packages: the .pth must be
    at its top, as written in the repository. Run with this environment's setuptools, which
    must be one pip would build with (pyproject.toml: 64+; a Python 3.9 venv ships 58)."""
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 64:
        pytest.skip(f"setuptools {setuptools.__version__} here; pip builds with 64+ "
                    f"(pip install -U setuptools to run this)")
    src = tmp_path / "src"
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md", PTH):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    for package in ("mxmirror", "symbols"):
        shutil.copytree(ROOT / package, src / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    build = tmp_path / "build"
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib",
                           str(build)], cwd=src, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (build / PTH).read_text() == (ROOT / PTH).read_text()
    assert (build / "mxmirror" / "frontends" / "startup.py").is_file()


def test_python_versions_claimed_are_the_ones_required() -> None:
    """setup.cfg's python_requires, its classifiers and the README say the same versions,
    and this interpreter is one of them. 3.8 is excluded (functools.cache, module-level
    tuple[...] subscripts); 3.12+ has no numpy<1.24 wheels. Only one interpreter runs here:
    3.9 and 3.10 were checked by running the whole suite in their own venvs."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["options"]["python_requires"].replace(" ", "") == ">=3.9,<3.12"
    classifiers = re.findall(r"Python :: (3\.\d+)", cfg["metadata"]["classifiers"])
    assert classifiers == ["3.9", "3.10", "3.11"]
    for doc in (ROOT / "README.md", ROOT / "docs" / "quickstart.md"):
        assert "Python 3.9-3.11" in doc.read_text(), doc
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:  # and no other range
        ranges = re.findall(r"Python (3\.\d+) ?(?:-|to) ?(3\.\d+)", doc.read_text())
        assert set(ranges) <= {("3.9", "3.11")}, (doc, ranges)
    assert (3, 9) <= sys.version_info[:2] <= (3, 11)
