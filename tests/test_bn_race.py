"""BatchNorm running statistics a user reads are the true ones (mxmirror.runtime.aux_order).

MXNet 1.9.1's BatchNorm backward updates moving_mean/moving_var without the engine knowing
it writes them; every executor mxmirror binds orders them. "True" values: a plain run
(MXNet without mxmirror) that waits for the engine after every batch.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import mxmirror
from mxmirror.runtime import aux_order
from mxmirror.runtime.binds import unhooked
from mxmirror.runtime.segmented.executor import SegmentedExecutor
from mxmirror.runtime.segmented.runner import settle
from tests import mkldnn_off

# the graphs are small: plans are bound whatever they save, to compare what they compute
pytestmark = pytest.mark.usefixtures("plans_bound_regardless")

NO_MKLDNN = not mkldnn_off.MKLDNN
BATCH, SIZE = 8, 8
DEPTH = 32  # blocks: deep enough that recursive stays segmented under never-worse


def _net(layers: int = 4) -> mx.sym.Symbol:
    """conv-BN-ReLU blocks: learned gamma, fix_gamma=True (bn1) and a frozen gamma (bn2)."""
    x = mx.sym.var("data")
    for i in range(layers):
        x = mx.sym.Convolution(x, num_filter=4, kernel=(3, 3), pad=(1, 1), name=f"conv{i}")
        x = mx.sym.BatchNorm(x, fix_gamma=i == 1, name=f"bn{i}")
        x = mx.sym.Activation(x, act_type="relu", name=f"relu{i}")
    x = mx.sym.FullyConnected(mx.sym.flatten(x), num_hidden=3, name="fc")
    return mx.sym.SoftmaxOutput(x, name="softmax")


def _iters(batches: int) -> tuple[mx.io.NDArrayIter, mx.io.NDArrayIter]:
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, (BATCH * batches, 3, SIZE, SIZE)).astype(np.float32)
    y = rng.randint(0, 3, BATCH * batches).astype(np.float32)
    return (mx.io.NDArrayIter(x, y, BATCH, label_name="softmax_label"),
            mx.io.NDArrayIter(x[:BATCH], y[:BATCH], BATCH, label_name="softmax_label"))


def _fit(policy: str | None, contexts: int, batches: int, prefix: Path | None = None):
    """Module.fit with eval data and a metric; the values of its saved, reloaded checkpoint."""
    train, val = _iters(batches)
    mod = mx.mod.Module(_net(DEPTH), context=[mx.cpu(i) for i in range(contexts)],
                        fixed_param_names=["bn2_gamma"])
    kw = dict(eval_data=val, eval_metric=["acc", "ce"], num_epoch=1,
              initializer=mx.init.Xavier(), optimizer_params={"learning_rate": 0.5},
              batch_end_callback=(lambda _: mx.nd.waitall()) if policy is None else None)
    mx.random.seed(1)
    with mxmirror.enabled(policy) if policy is not None else contextlib.nullcontext():
        mod.fit(train, **kw)
    if prefix is None:
        mx.nd.waitall()
        args, aux = mod.get_params()
        return mod, {k: v.asnumpy() for k, v in {**args, **aux}.items()}
    mod.save_checkpoint(str(prefix), 1)
    _, args, aux = mx.model.load_checkpoint(str(prefix), 1)
    return mod, {k: v.asnumpy() for k, v in {**args, **aux}.items()}


_TRUE: dict[tuple[int, int], dict] = {}


def _true(contexts: int, batches: int) -> dict:
    if (contexts, batches) not in _TRUE:
        _TRUE[(contexts, batches)] = _fit(None, contexts, batches)[1]
    return _TRUE[(contexts, batches)]


@pytest.mark.parametrize("batches", [1, 3])
@pytest.mark.parametrize("contexts", [1, 2])
@pytest.mark.parametrize("policy", ["none", "sqrt", "optimal", "recursive"])
def test_fit_checkpoint_equals_true_values(policy, contexts, batches, tmp_path) -> None:
    true = _true(contexts, batches)
    mod, saved = _fit(policy, contexts, batches, tmp_path / "ckpt")
    kind = type(mod._exec_group.execs[0])
    assert (kind is SegmentedExecutor) == (policy == "recursive")
    assert saved.keys() == true.keys()
    bad = {k: float(np.abs(saved[k] - true[k]).max()) for k in true
           if not np.array_equal(saved[k], true[k])}
    assert not bad, bad
    # reloaded into a fresh planned Module: every parameter and statistic as saved
    train, _ = _iters(batches)
    again = mx.mod.Module.load(str(tmp_path / "ckpt"), 1, context=mx.cpu())
    with mxmirror.enabled(policy):
        again.bind(train.provide_data, train.provide_label)
    args, aux = again.get_params()
    assert all(np.array_equal(v.asnumpy(), true[k]) for k, v in {**args, **aux}.items())
    assert any(not np.array_equal(true[k], 0 if "mean" in k else 1)
               for k in true if "moving" in k)  # the statistics did move


def _stale_after_backward(ex, repeats: int = 5) -> int:
    """How often a copy pushed right after backward misses BatchNorm's update of bn0."""
    stale = 0
    for _ in range(repeats):
        ex.forward(is_train=True)
        ex.backward()
        early = ex.aux_dict["bn0_moving_mean"].copy()
        mx.nd.waitall()
        stale += not np.array_equal(early.asnumpy(), ex.aux_dict["bn0_moving_mean"].asnumpy())
    return stale


def _bind(bind):
    ex = bind(_net(DEPTH), mx.cpu(), data=(BATCH, 3, 16, 16), softmax_label=(BATCH,))
    for a in ex.arg_arrays:
        a[:] = mx.nd.random.uniform(-0.3, 0.3, a.shape)
    for name, a in ex.aux_dict.items():
        a[:] = 1 if "var" in name else 0
    return ex


def test_plain_mxnet_reads_stale_statistics() -> None:
    """The race the rest of this file guards against, in plain MXNet (no mxmirror)."""
    assert _stale_after_backward(_bind(unhooked("simple_bind"))) > 0


@pytest.mark.parametrize("policy", ["none", "sqrt", "recursive"])
def test_copy_right_after_backward_sees_the_update(policy) -> None:
    with mxmirror.enabled(policy):
        ex = _bind(mx.sym.Symbol.simple_bind)
    assert isinstance(ex, SegmentedExecutor) == (policy == "recursive")
    assert _stale_after_backward(ex) == 0


def test_inference_forward_right_after_backward() -> None:
    """MXNet stamps is_train on an executor's ops when it pushes them: an inference forward
    pushed while the segmented executor's recomputations are queued must not change them."""
    def run(bind, wait):
        ex = _bind(bind)
        ex.forward(is_train=True)
        ex.backward()
        if wait:  # plain MXNet has the same hazard: its true values wait
            mx.nd.waitall()
        out = ex.forward(is_train=False)[0]
        mx.nd.waitall()
        arrays = {**ex.aux_dict, **{k: g for k, g in ex.grad_dict.items() if g is not None}}
        return out.asnumpy(), {k: v.asnumpy() for k, v in arrays.items()}

    mx.random.seed(0)
    out, true = run(unhooked("simple_bind"), True)
    mx.random.seed(0)
    with mxmirror.enabled("recursive"):
        got_out, got = run(mx.sym.Symbol.simple_bind, False)
    # bit-identical without MKL-DNN; with it sub-executors round differently (issue 13)
    tol = dict(rtol=0, atol=0) if NO_MKLDNN else dict(rtol=1e-5, atol=1e-6)
    assert np.allclose(got_out, out, **tol)
    bad = [k for k in true if not np.allclose(got[k], true[k], **tol)]
    assert not bad, bad


def test_simple_bind_plan_bind_and_reshape_are_ordered() -> None:
    ex = mxmirror.simple_bind(_net(8), mx.cpu(), policy="sqrt", data=(BATCH, 3, 16, 16),
                              softmax_label=(BATCH,))
    assert "backward" in vars(ex)
    smaller = ex.reshape(data=(BATCH // 2, 3, 16, 16), softmax_label=(BATCH // 2,))
    assert "backward" in vars(smaller)
    planned = mxmirror.plan(_net(8), policy="sqrt", data=(BATCH, 3, 16, 16),
                            softmax_label=(BATCH,))
    assert "backward" in vars(planned.bind(mx.cpu(), data=(BATCH, 3, 16, 16),
                                           softmax_label=(BATCH,)))


def test_grad_req_add_orders_too() -> None:
    with mxmirror.enabled("sqrt"):
        ex = _net(8).simple_bind(mx.cpu(), grad_req="add", data=(BATCH, 3, 16, 16),
                                 softmax_label=(BATCH,))
    for a in ex.arg_arrays:
        a[:] = mx.nd.random.uniform(-0.3, 0.3, a.shape)
    assert _stale_after_backward(ex) == 0


def test_disabled_hook_leaves_executors_alone() -> None:
    with mxmirror.enabled("none"):
        pass
    ex = _net().simple_bind(mx.cpu(), data=(BATCH, 3, SIZE, SIZE), softmax_label=(BATCH,))
    assert "backward" not in vars(ex)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_settle_leaves_values_bit_identical(dtype) -> None:
    rng = np.random.RandomState(0)
    values = [rng.standard_normal(n).astype(dtype) for n in (1, 7, 64)]
    values[1][3] = np.nan
    arrays = [mx.nd.array(v, dtype=dtype) for v in values]
    mixed = arrays + [mx.nd.array(values[2], dtype="float32" if dtype != "float32" else
                                  "float16")]
    aux_order.settle(mixed)
    for v, a in zip(values, arrays):
        assert a.dtype == np.dtype(dtype)
        assert v.tobytes() == a.asnumpy().tobytes()


def test_segmented_executor_uses_the_same_ordering() -> None:
    assert settle is aux_order.settle


def test_without_mkldnn() -> None:
    """The same checks in a child with MXNET_MKLDNN_ENABLED=0 (read at process start)."""
    if not mkldnn_off.MKLDNN:
        pytest.skip("already the child")
    mkldnn_off.run_pytest(__file__, "not without_mkldnn")
