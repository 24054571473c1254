"""The bind-time hook: unchanged training code (Module, BucketingModule,
Symbol.bind, ``mxmirror run``, MXMIRROR_POLICY) trains with the plan, and
trains exactly as it would without it.
"""

from __future__ import annotations

import functools
import logging
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import mxmirror
from symbols.lstm import ptb_lm
from symbols.resnet import resnet_by_depth
from tests.helpers import bound_regardless, child_env, log_lines

ROOT = Path(__file__).resolve().parents[1]
BATCH, NUM_BATCHES, CLASSES = 4, 3, 10
SHAPE = (3, 32, 32)
RTOL, ATOL = 1e-5, 1e-6


def _net() -> mx.sym.Symbol:
    return resnet_by_depth(8, bottleneck=False, num_classes=CLASSES, image_shape=SHAPE)


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(3)
    x = rng.uniform(-1, 1, (BATCH * NUM_BATCHES, *SHAPE)).astype(np.float32)
    y = rng.randint(0, CLASSES, BATCH * NUM_BATCHES).astype(np.float32)
    return x, y


def _params(sym: mx.sym.Symbol) -> tuple[dict, dict]:
    """Seeded initial parameters and aux states, as NDArrays."""
    arg_shapes, _, aux_shapes = sym.infer_shape(data=(BATCH, *SHAPE), softmax_label=(BATCH,))
    rng = np.random.RandomState(0)
    args = {}
    for name, shape in zip(sym.list_arguments(), arg_shapes):
        if name in ("data", "softmax_label"):
            continue
        scale = np.sqrt(3.0 / max(int(np.prod(shape[1:])), 1)) if len(shape) > 1 else 0.5
        args[name] = mx.nd.array(rng.uniform(-scale, scale, shape))
    aux = {name: mx.nd.array(rng.uniform(0.5, 1.5, shape) if "var" in name
                             else rng.uniform(-0.1, 0.1, shape))
           for name, shape in zip(sym.list_auxiliary_states(), aux_shapes)}
    return args, aux


def _train_module(contexts) -> mx.mod.Module:
    """Two-to-three batches of plain Module training with sgd."""
    sym = _net()
    x, y = _data()
    it = mx.io.NDArrayIter(x, y, batch_size=BATCH, label_name="softmax_label")
    mod = mx.mod.Module(sym, context=contexts)
    mod.bind(data_shapes=it.provide_data, label_shapes=it.provide_label)
    args, aux = _params(sym)
    mod.init_params(arg_params=args, aux_params=aux)
    mod.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.1})
    for batch in it:
        mod.forward_backward(batch)
        mod.update()
    mx.nd.waitall()
    return mod


def _dicts(mod: mx.mod.Module) -> tuple[dict, dict]:
    ex = mod._exec_group.execs[0]
    return ({k: v.asnumpy() for k, v in ex.arg_dict.items()},
            {k: v.asnumpy() for k, v in ex.aux_dict.items()})


def _assert_same(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys()
    bad = [k for k in a if not np.allclose(a[k], b[k], rtol=RTOL, atol=ATOL)]
    assert not bad, f"{what} differ: {bad[:5]}"


def _mirrored(ex) -> bool:
    return "_mirror" in ex.debug_str()


# ------------------------------------------------------------------ Module
@pytest.fixture(scope="module")
def unplanned_module() -> mx.mod.Module:
    return _train_module(mx.cpu())


def test_module_one_context_identical(unplanned_module) -> None:
    with mxmirror.enabled("sqrt"):
        planned = _train_module(mx.cpu())
    assert _mirrored(planned._exec_group.execs[0])
    assert not _mirrored(unplanned_module._exec_group.execs[0])
    base_args, base_aux = _dicts(unplanned_module)
    args, aux = _dicts(planned)
    # the parameters really moved, so the comparison is not vacuous
    init_args, init_aux = _params(_net())
    assert any(not np.allclose(base_args[k], v.asnumpy()) for k, v in init_args.items())
    assert any(not np.allclose(base_aux[k], v.asnumpy()) for k, v in init_aux.items())
    _assert_same(base_args, args, "parameters")
    _assert_same(base_aux, aux, "BatchNorm aux states")


def test_hook_off_outside_block() -> None:
    with mxmirror.enabled("sqrt"):
        pass
    ex = _net().simple_bind(mx.cpu(), data=(BATCH, *SHAPE), softmax_label=(BATCH,))
    assert not _mirrored(ex)


def test_enable_disable() -> None:
    mxmirror.enable("sqrt")
    try:
        ex = _net().simple_bind(mx.cpu(), data=(BATCH, *SHAPE), softmax_label=(BATCH,))
        assert _mirrored(ex)
    finally:
        mxmirror.disable()
    ex = _net().simple_bind(mx.cpu(), data=(BATCH, *SHAPE), softmax_label=(BATCH,))
    assert not _mirrored(ex)


def test_module_two_contexts() -> None:
    ctxs = [mx.cpu(0), mx.cpu(1)]
    base = _train_module(ctxs)
    with mxmirror.enabled("sqrt"):
        planned = _train_module(ctxs)
    assert len(planned._exec_group.execs) == 2
    for ex in planned._exec_group.execs:
        assert _mirrored(ex)
    # BatchNorm aux states differ even between two unplanned runs on two
    # contexts, so only the parameters are compared.
    _assert_same(_dicts(base)[0], _dicts(planned)[0], "parameters (two contexts)")


# ------------------------------------------------------------------ BucketingModule
VOCAB, LM_BATCH, LM_HIDDEN, BUCKETS = 20, 4, 16, (3, 5)


def _lm_explicit_state(seq_len: int) -> mx.sym.Symbol:
    """ptb_lm with the begin states as (learned) variables instead of mx.rnn's zeros."""
    data = mx.sym.Variable("data")
    label = mx.sym.Variable("softmax_label")
    embed = mx.sym.Embedding(data, input_dim=VOCAB, output_dim=8, name="embed")
    stack = mx.rnn.SequentialRNNCell()
    for i in range(2):
        stack.add(mx.rnn.LSTMCell(num_hidden=LM_HIDDEN, prefix=f"lstm_l{i}_"))
    begin = [mx.sym.Variable(f"begin_{i}", shape=(LM_BATCH, LM_HIDDEN), init=mx.init.Zero())
             for i in range(4)]
    outputs, _ = stack.unroll(seq_len, inputs=embed, begin_state=begin, layout="NTC",
                              merge_outputs=True)
    pred = mx.sym.Reshape(outputs, shape=(-1, LM_HIDDEN), name="pred_reshape")
    pred = mx.sym.FullyConnected(pred, num_hidden=VOCAB, name="pred")
    label = mx.sym.Reshape(label, shape=(-1,), name="label_reshape")
    return mx.sym.SoftmaxOutput(pred, label, name="softmax")


def _ptb_lm(seq_len: int) -> mx.sym.Symbol:
    return ptb_lm(seq_len, VOCAB, num_layers=2, num_hidden=LM_HIDDEN, num_embed=8)


def _train_buckets(make, policy: str, buckets: tuple[int, ...] = BUCKETS
                   ) -> tuple[mx.mod.BucketingModule, list, dict]:
    """Bucketing training from seeded parameters over buckets of both size orders: the
    initial parameters, the outputs of every step, and the parameters at the end. The LMs
    are small: their plans are bound whatever their mirror copies' own structures cost."""
    def sym_gen(seq_len):
        return make(seq_len), ("data",), ("softmax_label",)

    rng = np.random.RandomState(0)
    mx.random.seed(0)
    outputs = []
    with mxmirror.enabled(policy), bound_regardless():
        mod = mx.mod.BucketingModule(sym_gen, default_bucket_key=max(buckets),
                                     context=mx.cpu())
        mod.bind(data_shapes=[("data", (LM_BATCH, max(buckets)))],
                 label_shapes=[("softmax_label", (LM_BATCH, max(buckets)))])
        mod.init_params(initializer=mx.init.Xavier())
        outputs.append({k: v.asnumpy() for k, v in mod.get_params()[0].items()})
        mod.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.1})
        for key in (*buckets, *buckets[::-1]):
            data = mx.nd.array(rng.randint(0, VOCAB, (LM_BATCH, key)))
            label = mx.nd.array(rng.randint(0, VOCAB, (LM_BATCH, key)))
            db = mx.io.DataBatch(
                [data], [label], bucket_key=key,
                provide_data=[mx.io.DataDesc("data", data.shape)],
                provide_label=[mx.io.DataDesc("softmax_label", label.shape)])
            mod.forward(db, is_train=True)
            mod.backward()
            mod.update()
            outputs.append(mod.get_outputs()[0].asnumpy())
    mx.nd.waitall()
    args, _ = mod.get_params()
    return mod, outputs, {k: v.asnumpy() for k, v in args.items()}


@pytest.mark.parametrize("make", [_ptb_lm, _lm_explicit_state],
                         ids=["ptb_lm", "explicit_begin_state"])
def test_bucketing_module_all_buckets_planned(make) -> None:
    """Every bucket's executor is planned, and training equals the unplanned run's: the
    outputs of every step and the parameters at the end."""
    _, (base_init, *base_outputs), base_params = _train_buckets(make, "none")
    with log_lines() as lines:
        mod, (init, *outputs), params = _train_buckets(make, "sqrt")
    failures = [line for line in lines if "planning failed" in line]
    assert not failures, failures
    # one line per bucket, saying which: its key and shapes
    said = [re.match(r"mxmirror: bucket (\d+) data=(\S+) softmax_label=(\S+) policy=sqrt ",
                     line) for line in lines]
    assert all(said) and len(said) == len(BUCKETS), lines
    assert sorted(m.groups() for m in said) == sorted(
        (str(k), f"{LM_BATCH}x{k}", f"{LM_BATCH}x{k}") for k in BUCKETS), lines
    assert set(BUCKETS) <= set(mod._buckets)
    for key in BUCKETS:
        for ex in mod._buckets[key]._exec_group.execs:
            assert _mirrored(ex), f"bucket {key} not planned"
    assert [o.shape for o in outputs] == [(LM_BATCH * k, VOCAB)
                                          for k in (*BUCKETS, *BUCKETS[::-1])]
    # bit-identical (measured: max difference 0.0 on both nets)
    for step, (got, want) in enumerate(zip(outputs, base_outputs)):
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")
    assert init.keys() == base_init.keys() == params.keys() == base_params.keys()
    for k in base_init:
        np.testing.assert_array_equal(init[k], base_init[k], err_msg=f"initial {k}")
        np.testing.assert_array_equal(params[k], base_params[k], err_msg=f"trained {k}")
    assert any(not np.allclose(base_init[k], base_params[k]) for k in base_params), \
        "training must move the parameters"


def test_a_bucket_that_fits_the_default_buckets_memory_binds_unplanned() -> None:
    """A further bucket whose unplanned storage fits the pool of the default bucket's
    executor, which it shares, allocates nothing a plan would save: it binds unplanned, said
    so; a larger one is planned; training equals the unplanned run's bit for bit."""
    from mxmirror.frontends import hook
    from mxmirror.sim.shared_pool import fit

    buckets = (4, 10, 12)  # 12 is the default; 4 fits its planned pool, 10 does not
    _, (base_init, *base_outputs), base_params = _train_buckets(_ptb_lm, "none", buckets)
    hook._logged.clear()  # each line again, though an earlier test bound these keys
    with log_lines() as lines:
        mod, (init, *outputs), params = _train_buckets(_ptb_lm, "sqrt", buckets)
    by_bucket = {int(m.group(1)): line for line in lines
                 if (m := re.match(r"mxmirror: bucket (\d+) ", line))}
    assert sorted(by_bucket) == sorted(buckets), lines
    fits = "not used, binding unplanned: unplanned it allocates"
    assert fits in by_bucket[4] and fits not in by_bucket[10] + by_bucket[12], lines
    mirrored = {k: _mirrored(mod._buckets[k]._exec_group.execs[0]) for k in buckets}
    assert mirrored == {4: False, 10: True, 12: True}
    # what the rule compared, for bucket 4 beside the default's planned pool, and for 10
    plan = {k: mxmirror.plan(_ptb_lm(k), "sqrt", data=(LM_BATCH, k),
                             softmax_label=(LM_BATCH, k)) for k in buckets}
    pool = list(plan[12].planned_blocks)
    for k, fits_it in ((4, True), (10, False)):  # in the order they bind
        unplanned = fit(pool, plan[k].baseline_blocks)[1]
        planned = fit(pool, plan[k].planned_blocks)[1]
        assert (sum(unplanned) <= sum(planned)) is fits_it, k
        pool += unplanned if fits_it else planned  # what the bind adds to the pool
    for step, (got, want) in enumerate(zip(outputs, base_outputs)):
        np.testing.assert_array_equal(got, want, err_msg=f"step {step}")
    for k in base_init:
        np.testing.assert_array_equal(init[k], base_init[k], err_msg=f"initial {k}")
        np.testing.assert_array_equal(params[k], base_params[k], err_msg=f"trained {k}")


def test_a_shared_pool_is_matched_largest_first_by_the_smallest_array_that_fits() -> None:
    """As GraphExecutor::InitDataEntryMemory: each block, largest first, takes the smallest
    free array at least its size; what finds none is allocated anew."""
    from mxmirror.sim.shared_pool import fit

    assert fit([10, 4, 4], [4, 9, 5]) == ([10, 4], [5])
    assert fit([], [3, 1]) == ([], [3, 1])
    assert fit([8, 8], [8, 8, 8]) == ([8, 8], [8])


# ------------------------------------------------------------------ Symbol.bind / simple_bind
def test_symbol_bind_with_explicit_arrays_is_planned() -> None:
    sym = _net()
    x, y = _data()
    args, aux = _params(sym)

    def run():
        arrays = dict(args, data=mx.nd.array(x[:BATCH]), softmax_label=mx.nd.array(y[:BATCH]))
        arrays = {k: v.copy() for k, v in arrays.items()}
        grads = {k: mx.nd.zeros(v.shape) for k, v in arrays.items()
                 if k not in ("data", "softmax_label")}
        ex = sym.bind(mx.cpu(), args=arrays, args_grad=grads,
                      aux_states={k: v.copy() for k, v in aux.items()})
        ex.forward(is_train=True)
        ex.backward()
        return ex, {k: g.asnumpy() for k, g in grads.items()}, ex.outputs[0].asnumpy()

    base_ex, base_grads, base_out = run()
    with mxmirror.enabled("sqrt"):
        ex, grads, out = run()
    assert not _mirrored(base_ex)
    assert _mirrored(ex)
    assert np.allclose(out, base_out, rtol=RTOL, atol=ATOL)
    _assert_same(base_grads, grads, "gradients")


def test_policy_none_says_the_hook_is_on() -> None:
    with log_lines() as lines, mxmirror.enabled("none"):
        _net().simple_bind(mx.cpu(), data=(BATCH, *SHAPE), softmax_label=(BATCH,))
    assert lines == ["mxmirror: policy=none: the bind hook is on and plans nothing "
                     "(BatchNorm statistics are ordered after each backward)"]


def test_symbol_bind_without_grads_is_left_alone() -> None:
    sym = _net()
    args, aux = _params(sym)
    arrays = dict(args, data=mx.nd.zeros((BATCH, *SHAPE)), softmax_label=mx.nd.zeros(BATCH))
    with mxmirror.enabled("sqrt"):
        ex = sym.bind(mx.cpu(), args=arrays, aux_states=aux, grad_req="null")
        ex.forward(is_train=False)
    assert not _mirrored(ex)


def test_simple_bind_function() -> None:
    sym = _net()
    ex = mxmirror.simple_bind(sym, mx.cpu(), policy="sqrt", data=(BATCH, *SHAPE),
                              softmax_label=(BATCH,))
    assert _mirrored(ex)
    ex.forward(is_train=True)
    ex.backward()
    assert ex.outputs[0].shape == (BATCH, CLASSES)


# ------------------------------------------------------------------ a budget is a promise
def _fit_module(x, y) -> mx.mod.Module:
    """Module.fit with eval data and a metric, from the same seeded parameters."""
    sym = _net()
    train = mx.io.NDArrayIter(x, y, batch_size=BATCH, label_name="softmax_label")
    val = mx.io.NDArrayIter(x, y, batch_size=BATCH, label_name="softmax_label")
    mod = mx.mod.Module(sym, context=mx.cpu())
    args, aux = _params(sym)
    mod.fit(train, eval_data=val, eval_metric="acc", num_epoch=1, arg_params=args,
            aux_params=aux, optimizer="sgd", optimizer_params={"learning_rate": 0.1})
    mx.nd.waitall()
    return mod


def test_impossible_budget_binds_the_smallest_plan_through_fit() -> None:
    """A budget below every plan: the smallest plan trains (as policy auto would), said in
    mxmirror's own log line, no warning; training equals the unplanned run's."""
    x, y = _data()
    plain = _fit_module(x, y)
    with warnings.catch_warnings(record=True) as caught, log_lines() as lines:
        warnings.simplefilter("always")
        with mxmirror.enabled("budget", budget="1KB"):
            planned = _fit_module(x, y)
    assert not [str(w.message) for w in caught if "mxmirror" in str(w.message)]
    ours = [line for line in lines if "policy=budget" in line]
    assert len(ours) == 1, lines
    assert re.search(r"budget=1 KB \(given\); the smallest plan is used: budget 1\.0 KB is "
                     r"below the smallest planned memory any policy reaches: \d+\.\d MB "
                     r"\(the \w+ plan, \d\.\d\dx recompute\)", ours[0]), ours[0]
    assert _mirrored(planned._exec_group.execs[0])
    _assert_same(_dicts(plain)[0], _dicts(planned)[0], "parameters after fit")
    assert planned.score(mx.io.NDArrayIter(x, y, batch_size=BATCH), "acc") == \
        plain.score(mx.io.NDArrayIter(x, y, batch_size=BATCH), "acc")


# ------------------------------------------------------------------ subprocesses
TRAIN_SCRIPT = """
import sys
import mxnet as mx
import numpy as np

data = mx.sym.Variable("data")
x = data
for i in range(6):  # wide enough that a plan saves more than its mirror copies cost
    x = mx.sym.FullyConnected(x, num_hidden=512, name=f"fc{i}")
    x = mx.sym.BatchNorm(x, name=f"bn{i}")
    x = mx.sym.Activation(x, act_type="relu", name=f"relu{i}")
x = mx.sym.FullyConnected(x, num_hidden=10, name="out")
sym = mx.sym.SoftmaxOutput(x, name="softmax")
rng = np.random.RandomState(0)
it = mx.io.NDArrayIter(rng.uniform(size=(192, 32)), rng.randint(0, 10, 192), batch_size=64)
mod = mx.mod.Module(sym, context=mx.cpu())
mod.fit(it, num_epoch=1, optimizer="sgd", optimizer_params={"learning_rate": 0.1})
ex = mod._exec_group.execs[0]
print("trained", "mirror=" + str("_mirror" in ex.debug_str()), "argv=" + ",".join(sys.argv[1:]))
"""


def test_mxmirror_run_cli(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "mxmirror", "run", "--policy", "sqrt",
                           str(script), "--epochs", "1"], capture_output=True, text=True,
                          cwd=tmp_path, env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "mxmirror: policy=sqrt" in proc.stderr
    assert "trained mirror=True argv=--epochs,1" in proc.stdout


@pytest.mark.parametrize("how", ["run", "env"])
def test_impossible_budget_in_a_script(tmp_path: Path, how: str) -> None:
    """`mxmirror run --policy budget --budget 1KB` and MXMIRROR_POLICY=budget
    MXMIRROR_BUDGET=1KB: the script trains with the smallest plan, one mxmirror line says
    so, and nothing is printed from MXNet's code."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    if how == "run":
        argv, env = ["-m", "mxmirror", "run", "--policy", "budget", "--budget", "1KB"], {}
    else:
        argv, env = [], {"MXMIRROR_POLICY": "budget", "MXMIRROR_BUDGET": "1KB"}
    proc = subprocess.run([sys.executable, *argv, str(script)], capture_output=True,
                          text=True, cwd=tmp_path, env=child_env(**env), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "trained mirror=True" in proc.stdout
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("mxmirror: ")]
    assert len(ours) == 1 and "budget=1 KB (given); the smallest plan is used: budget 1.0 KB" \
        in ours[0], proc.stderr
    assert "Warning" not in proc.stderr and "executor_group" not in proc.stderr, proc.stderr


def test_env_policy_at_import(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import mxmirror
        from symbols.resnet import resnet_by_depth
        import mxnet as mx
        sym = resnet_by_depth(8, bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
        ex = sym.simple_bind(mx.cpu(), data=(4, 3, 32, 32), softmax_label=(4,))
        print("mirror=" + str("_mirror" in ex.debug_str()))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=child_env(MXMIRROR_POLICY="cheap"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "mxmirror: policy=cheap" in proc.stderr
    assert "mirror=True" in proc.stdout


def test_env_bad_policy_stops_at_mxnet_import(tmp_path: Path) -> None:
    """A policy the process cannot plan with is an error, not a warning then an unplanned
    run; importing mxmirror alone (no mxnet, nothing to plan) still works."""
    code = "import mxmirror; print('imported', flush=True); import mxnet; print('mxnet')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=child_env(MXMIRROR_POLICY="bogus"), timeout=300)
    assert proc.returncode == 2
    assert proc.stdout.split() == ["imported"]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "mxmirror: error: MXMIRROR_POLICY=bogus: unknown policy 'bogus'"), proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ the README's pattern
def _readme_snippet() -> str:
    """The README's Python block that turns the flag on around a Module."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return next(b for b in blocks if "mxmirror.enabled(" in b)


def _fit(snippet: str):
    sym = _net()
    x, y = _data()
    train_iter = mx.io.NDArrayIter(x, y, batch_size=BATCH, label_name="softmax_label")
    val_iter = mx.io.NDArrayIter(x, y, batch_size=BATCH, label_name="softmax_label")
    mod = mx.mod.Module(sym, context=mx.cpu())
    args, aux = _params(sym)
    mod.init_params = functools.partial(mod.init_params, arg_params=args, aux_params=aux,
                                        force_init=True)
    mx.random.seed(0)
    exec(snippet, {"mxmirror": mxmirror, "mod": mod, "train_iter": train_iter,
                   "val_iter": val_iter})
    mx.nd.waitall()
    return mod


def _run_readme(snippet: str) -> mx.mod.Module:
    """The README's block as written (seeded: its Module initialises from MXNet's RNG)."""
    mx.random.seed(0)
    namespace: dict = {}
    exec(snippet, namespace)
    mx.nd.waitall()
    return namespace["mod"]


def test_readme_pattern_binds_once_and_trains_as_plain_fit(caplog) -> None:
    snippet = _readme_snippet()
    assert "mod.bind(" not in snippet, "fit binds; a bind of one's own makes MXNet warn"
    with caplog.at_level(logging.WARNING):
        planned = _run_readme(snippet)
    assert not [r for r in caplog.records if "Already bound" in r.getMessage()]
    assert _mirrored(planned._exec_group.execs[0])
    flag = 'with mxmirror.enabled(policy="sqrt"):'
    assert flag in snippet
    plain = _run_readme(snippet.replace(flag, "if True:"))
    assert not _mirrored(plain._exec_group.execs[0])
    _assert_same(_dicts(plain)[0], _dicts(planned)[0], "parameters after fit")


def test_bind_then_fit_is_what_mxnet_warns_about(caplog) -> None:
    """The old README pattern: the warning the test above checks for really is MXNet's."""
    with caplog.at_level(logging.WARNING):
        _fit("with mxmirror.enabled('sqrt'):\n"
             "    mod.bind(data_shapes=train_iter.provide_data,"
             " label_shapes=train_iter.provide_label)\n"
             "mod.fit(train_iter, num_epoch=1)\n")
    assert [r for r in caplog.records if "Already bound" in r.getMessage()]


def test_cheap_says_why_it_mirrors_nothing() -> None:
    """On a small FC-ReLU net recomputing the activations would not lower memory: the plan
    and the bind hook's log line say so, with the figure it would have had."""
    x = mx.sym.Variable("data")
    for i in range(4):
        x = mx.sym.Activation(mx.sym.FullyConnected(x, num_hidden=256, name=f"fc{i}"),
                              act_type="relu", name=f"relu{i}")
    sym = mx.sym.SoftmaxOutput(x, name="softmax")
    p = mxmirror.plan(sym, policy="cheap", data=(64, 256))
    assert p.mirrored == [] and p.planned_bytes == p.baseline_bytes
    assert p.notes[0].startswith("recomputing the 4 cheap ops would not lower memory: "
                                 "MXNet's in-place ops and memory sharing"), p.notes
    assert re.search(r"the cheap plan: \d+ [KM]B, no plan: \d+ [KM]B", p.notes[-1]), p.notes
    assert all(note in p.summary() for note in p.notes)
    with log_lines() as lines, mxmirror.enabled("cheap"):  # the hook's one line per bind
        sym.simple_bind(mx.cpu(), data=(64, 256), softmax_label=(64,))
    assert len(lines) == 1, "\n".join(lines)
    assert "mirrored=0 nodes (recomputing the 4 cheap ops" in lines[0]
    assert "the cheap plan:" in lines[0]
