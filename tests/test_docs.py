"""Examples that run as pasted: every ```python block of README.md and docs/*.md, each in a
child process of its own (so no block leans on another), in an empty folder, offline.
"..." belongs in prose only: no code block holds it.

Blocks of docs other sessions are rewriting are expected to fail (strict: once one runs,
the mark must go) until they are made complete; OWNED_ELSEWHERE says why."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mxmirror.planning.cache import cache_path
from tests.helpers import child_env

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SECONDS = 120  # a block that needs longer is not an example a reader pastes and waits for

# (file, index of its python block) -> why it does not run yet
OWNED_ELSEWHERE = {
    ("docs/gluon.md", 0): "downloads CIFAR-10 and trains ResNet-50 for 10 epochs (the Gluon "
                          "issue owns docs/gluon.md)",
    ("docs/gluon.md", 1): "a fragment: net_d, net_g, loss and the data are not defined",
    ("docs/gluon.md", 2): "a fragment: planned, loss_fn, x and y are not defined",
}


def _blocks() -> list:
    params = []
    for doc in DOCS:
        name = doc.relative_to(ROOT).as_posix()
        text = doc.read_text()
        python = [m for m in FENCE.finditer(text) if m.group(1) == "python"]
        for k, m in enumerate(python):
            line = text[:m.start()].count("\n") + 1
            marks = ([pytest.mark.xfail(reason=OWNED_ELSEWHERE[name, k], strict=True)]
                     if (name, k) in OWNED_ELSEWHERE else [])
            params.append(pytest.param(m.group(2), id=f"{name}:{line}", marks=marks))
    return params


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    """A cache of the blocks' own (their plans are not the user's), with the templates
    learned already (learning them takes child binds)."""
    folder = tmp_path_factory.mktemp("docs-cache")
    root = cache_path()
    if root is None:
        return "off"
    for templates in root.glob("templates-*.json"):
        shutil.copy(templates, folder / templates.name)
    return str(folder)


@pytest.mark.parametrize("code", _blocks())
def test_python_block_runs_as_pasted(code: str, cache: str, tmp_path: Path) -> None:
    assert "..." not in code, "'...' in a code block: complete the example"
    (tmp_path / "example.py").write_text(code)
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=SECONDS, env=child_env(MXMIRROR_CACHE=cache))
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_no_ellipsis_in_other_code_blocks() -> None:
    """Command lines and output shown in code blocks are complete too."""
    found = [f"{doc.relative_to(ROOT)}: {line.strip()}" for doc in DOCS
             for m in FENCE.finditer(doc.read_text()) if m.group(1) != "python"
             for line in m.group(2).splitlines() if "..." in line]
    assert not found, found


def test_every_python_block_is_collected() -> None:
    """The fence pattern finds every block a reader sees (an opening ```python not matched
    would be a block never run)."""
    for doc in DOCS:
        text = doc.read_text()
        assert text.count("```python\n") == sum(
            m.group(1) == "python" for m in FENCE.finditer(text)), doc
