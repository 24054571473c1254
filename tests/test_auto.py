"""Policy ``auto``: the budget is the bind's free device memory less arguments, gradients,
aux states and a margin; no recompute where everything fits; an explicit budget wins."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from math import prod
from pathlib import Path

import mxnet as mx
import pytest

import mxmirror
from mxmirror.adapter import free_memory
from mxmirror.adapter.free_memory import MARGIN_FRACTION, MARGIN_MIN_BYTES, free_bytes
from mxmirror.api import prepare
from mxmirror.frontends.cli import main
from mxmirror.ir.graph import resident_bytes
from symbols.resnet import resnet_by_depth
from tests.helpers import child_env

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"data": (8, 3, 32, 32), "softmax_label": (8,)}


def _net() -> mx.sym.Symbol:
    return resnet_by_depth(20, bottleneck=False, num_classes=10, image_shape=(3, 32, 32))


@pytest.fixture(scope="module")
def prep():
    return prepare(_net(), **SHAPES)


def test_resident_bytes_are_mxnet_arguments_gradients_and_aux(prep) -> None:
    sym = _net()
    arg_shapes, _, aux_shapes = sym.infer_shape(**SHAPES)
    args = sum(prod(s) * 4 for s in arg_shapes)
    grads = sum(prod(s) * 4 for n, s in zip(sym.list_arguments(), arg_shapes)
                if prep.inputs.grad_req[n] != "null")
    aux = sum(prod(s) * 4 for s in aux_shapes)
    assert grads < args and aux > 0
    assert resident_bytes(prep.analysis.graph) == (args, grads, aux)


def _free(monkeypatch, free: int) -> None:
    monkeypatch.setattr(free_memory, "free_bytes", lambda ctx=None: (free, "test figure"))


def _auto_budget_for(prep, free: int) -> int:
    resident = sum(resident_bytes(prep.analysis.graph))
    margin = max(int(free * MARGIN_FRACTION), MARGIN_MIN_BYTES)
    return free - resident - margin


def test_auto_recomputes_nothing_when_everything_fits(prep, monkeypatch) -> None:
    free = 64 * 2**30
    _free(monkeypatch, free)
    p = prep.plan("auto")
    assert not p.recomputed_ids and p.planned_bytes == p.baseline_bytes
    budget = _auto_budget_for(prep, free)
    assert p.budget.startswith(f"{budget / 2**20:.0f} MB (auto: test figure")


def test_auto_on_little_free_memory_is_the_budget_policy_on_what_is_left(prep,
                                                                         monkeypatch) -> None:
    resident = sum(resident_bytes(prep.analysis.graph))
    target = (prep.plan("search").planned_bytes + prep.analysis.baseline.planned_bytes) // 2
    # free memory such that free - resident - margin == target (margin: the fixed minimum)
    free = target + resident + MARGIN_MIN_BYTES
    assert free * MARGIN_FRACTION < MARGIN_MIN_BYTES
    _free(monkeypatch, free)
    p = prep.plan("auto")
    same = prep.plan("budget", target)
    assert 0 < p.recompute_ratio == same.recompute_ratio
    assert p.planned_bytes == same.planned_bytes <= target < p.baseline_bytes


def test_auto_below_every_plan_takes_the_smallest(prep, monkeypatch) -> None:
    _free(monkeypatch, 1)
    p = prep.plan("auto")
    with pytest.raises(mxmirror.PlanError, match="any policy reaches"):
        prep.plan("budget", 1)
    assert p.recomputed_ids and p.notes[0].startswith("the smallest plan is used")


def test_an_explicit_budget_overrides_free_memory(prep, monkeypatch) -> None:
    def boom(ctx=None):
        raise AssertionError("free memory read although a budget was given")

    monkeypatch.setattr(free_memory, "free_bytes", boom)
    budget = prep.plan("sqrt").planned_bytes
    p = prep.plan("auto", budget)
    assert p.planned_bytes <= budget and p.budget.endswith("(given)")


def test_gpu_free_memory_comes_from_mxnet(monkeypatch) -> None:
    monkeypatch.setattr(mx.context, "gpu_memory_info", lambda i: ((i + 5) * 2**30, 16 * 2**30))
    free, source = free_bytes(mx.gpu(1))
    assert free == 6 * 2**30 and "gpu(1)" in source


def test_cpu_free_memory_is_available_memory() -> None:
    free, source = free_bytes(mx.cpu())
    assert free > 0
    if Path("/proc/meminfo").exists():
        text = Path("/proc/meminfo").read_text()
        kb = int(next(ln for ln in text.splitlines() if ln.startswith("MemAvailable")).split()[1])
        assert "MemAvailable" in source and abs(free - kb * 1024) < 2**30


def test_cli_plan_auto_reports_its_budget(tmp_path: Path, capsys) -> None:
    path = tmp_path / "net.json"
    _net().save(str(path))
    assert main(["plan", str(path), "--shape", "data=8,3,32,32", "--policy", "auto",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "auto" and "auto:" in out["budget"]


HOOKED = textwrap.dedent("""
    import mxmirror
    from symbols.resnet import resnet_by_depth
    import mxnet as mx
    sym = resnet_by_depth(20, bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
    ex = sym.simple_bind(mx.cpu(), data=(8, 3, 32, 32), softmax_label=(8,))
    print("mirror=" + str("_mirror" in ex.debug_str()))
""")


@pytest.mark.parametrize("budget", [None, "2MB"])
def test_env_auto_logs_its_budget(tmp_path: Path, budget: str | None) -> None:
    extra = {"MXMIRROR_POLICY": "auto", **({"MXMIRROR_BUDGET": budget} if budget else {})}
    proc = subprocess.run([sys.executable, "-c", HOOKED], capture_output=True, text=True,
                          cwd=tmp_path, env=child_env(**extra), timeout=300)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stderr.splitlines() if "mxmirror: policy=auto" in ln)
    if budget is None:  # a small net fits in this machine's free memory
        assert "budget=" in line and "auto: available system memory" in line
        assert "mirror=False" in proc.stdout
    else:
        assert "budget=2 MB (given)" in line
        assert "mirror=True" in proc.stdout
