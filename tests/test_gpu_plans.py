"""Plans for a GPU: cuDNN's BatchNorm checks that its output is written (src/operator/nn/
cudnn/cudnn_batch_norm-inl.h, MXNet 1.9.1), so a recomputed BatchNorm whose output nothing
reads (its copy asked to write nothing) fails there, where on a CPU it computes what it
should (ir/ops.MUST_WRITE_ON_GPU). A plan is made for the device it is bound on (``ctx``:
the bind hook's, PlannedBlock's, ``mxmirror.plan(..., ctx=)``, ``mxmirror plan --gpu``), and
a CPU plan that would run such a copy is refused on a GPU. No GPU runs here: what is checked
is the plan, before anything is bound."""

from __future__ import annotations

import json
import subprocess
import sys

import mxnet as mx
import pytest

import mxmirror
from mxmirror.errors import PlanError
from mxmirror.frontends import hook
from mxmirror.planning.analysis import Analysis
from symbols.resnet import resnet_by_depth
from tests.helpers import child_env
from tests.mkldnn_off import ROOT

SHAPES = {"data": (2, 3, 64, 64), "softmax_label": (2,)}


def _net():
    """ImageNet's bottleneck ResNet-50 (small images): its CPU plans recompute BatchNorms
    whose output nothing reads."""
    return resnet_by_depth(50)


def _unread_batchnorm_copies(plan) -> set[int]:
    """The recomputed nodes a GPU's rule would hold back: BatchNorm copies nothing reads,
    and the copies of ops that must write read only by them."""
    return set(plan.recomputed_ids) - Analysis(plan.graph, gpu=True).drop_unread(
        plan.recomputed_ids)


@pytest.mark.parametrize("policy", ["sqrt", "search"])
def test_a_plan_for_a_gpu_recomputes_no_unread_batchnorm(policy):
    sym = _net()
    cpu = mxmirror.plan(sym, policy, **SHAPES)
    gpu = mxmirror.plan(sym, policy, ctx=mx.gpu(0), **SHAPES)
    held = _unread_batchnorm_copies(cpu)
    # the CPU plan has some (and the copies only they read, held back with them)
    assert any(cpu.nodes[i][1] == "BatchNorm" for i in held)
    assert gpu.gpu and not _unread_batchnorm_copies(gpu)
    assert any(gpu.nodes[i][1] == "BatchNorm" for i in gpu.recomputed_ids)  # read ones stay
    with pytest.raises(PlanError, match="cuDNN refuses on a GPU: plan it for the GPU"):
        cpu.bind(mx.gpu(0), **SHAPES)


def test_the_bind_hook_plans_for_the_bind_context():
    sym = _net()
    req = {a: "null" if a in SHAPES else "write" for a in sym.list_arguments()}
    with mxmirror.enabled("sqrt"):
        on_cpu = hook._plan_for(sym, "sqrt", None, req, None, SHAPES, mx.cpu()).plan
        on_gpu = hook._plan_for(sym, "sqrt", None, req, None, SHAPES, mx.gpu(0)).plan
    assert not on_cpu.gpu and on_gpu.gpu
    assert on_cpu.recomputed_ids != on_gpu.recomputed_ids


def test_the_command_line_plans_for_a_gpu(tmp_path):
    sym = _net()
    sym.save(str(tmp_path / "net-symbol.json"))
    found = {}
    for flags in ([], ["--gpu"]):
        proc = subprocess.run([sys.executable, "-m", "mxmirror", "plan",
                               str(tmp_path / "net-symbol.json"), "--shape",
                               "data=2,3,64,64", "--json", *flags], capture_output=True,
                              text=True, cwd=ROOT, env=child_env(), timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        found[bool(flags)] = json.loads(proc.stdout)
    assert found[True]["mirrored"] != found[False]["mirrored"]


def test_a_plan_for_a_gpu_is_weighed_in_device_memory():
    """What a planned executor holds outside MXNet's figure on a CPU (its nodes' structures in
    host memory, MKL-DNN's layout copies) is no device memory: a plan for a GPU is weighed
    against its device saving alone."""
    from mxmirror.adapter.executor_memory import beyond_cached_op, beyond_unplanned

    sym = _net()
    cpu = mxmirror.plan(sym, "sqrt", **SHAPES)
    gpu = mxmirror.plan(sym, "sqrt", ctx=mx.gpu(0), **SHAPES)
    assert beyond_unplanned(cpu).total > 0 and beyond_cached_op(cpu).structures > 0
    assert beyond_unplanned(gpu).total == beyond_cached_op(gpu).total == 0
