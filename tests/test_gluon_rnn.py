"""Recurrent Gluon as users write it: a word-level language model in the style of MXNet's
own Gluon example (Embedding, a fused ``rnn.LSTM(hidden, 2, dropout)``, a Dense decoder,
``net(x, state)`` with a list of states returned and fed back each batch), its tied
encoder/decoder variant, an rnn layer given its states by keyword, and a hybridized
decoder step called once per step in a Python loop. Every gradient, parameter, output,
state and loss equals plain hybridized Gluon bit for bit, with MKL-DNN on and, where
plain Gluon runs without it (no fused RNN op), in a child with it off.

The language models' plans would save almost nothing (the fused RNN op is one random
op; what surrounds it is small or is the block's own output), so under ``sqrt`` they are
trained unplanned, said in the log line; ``policy="none"`` binds MXNet's executor anyway,
which is what these tests compare (its Dropout masks are the CachedOp's: measured equal).
"""

from __future__ import annotations

import contextlib
import logging

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn, rnn

import mxmirror
import mxmirror.gluon.signature
from mxmirror.gluon import PlannedBlock
from mxmirror.log import show as show_log
from symbols.gluon_lm import WordLM
from tests import mkldnn_off
from tests.helpers import bound_regardless, log_lines, read_step
from tests.test_gluon import assert_same


def train_lm(policy=None, hooked=False, tied=False, dropout=0.3, steps=3, T=12, B=4,
             vocab=50) -> dict:
    """Every array a user can read after `steps` batches of the example's loop: detach the
    states, record, backward, clip, step."""
    mx.random.seed(0)
    hidden = 16 if tied else 24
    net = WordLM(vocab, hidden if tied else 12, hidden, 2, dropout, tied=tied)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    model = net if policy is None or hooked else PlannedBlock(net, policy)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1.0, "wd": 0})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rs = np.random.RandomState(0)
    state = net.begin_state(func=mx.nd.zeros, batch_size=B)
    seen = {}
    with mxmirror.enabled(policy) if hooked else contextlib.nullcontext():
        for step in range(steps):
            data = mx.nd.array(rs.randint(0, vocab, (T, B)))
            target = mx.nd.array(rs.randint(0, vocab, (T, B)))
            state = [s.detach() for s in state]
            with autograd.record():
                output, state = model(data, state)
                loss = loss_fn(output, target.reshape((-1,)))
            loss.backward()
            grads = [p.grad() for p in net.collect_params().values()]
            for k, g in enumerate(grads):
                seen[f"grad{step}.{k}"] = g.asnumpy()
            gluon.utils.clip_global_norm(grads, 0.25 * B)
            trainer.step(B)
            seen[f"loss{step}"], seen[f"out{step}"] = loss.asnumpy(), output.asnumpy()
            for k, s in enumerate(state):
                seen[f"state{step}.{k}"] = s.asnumpy()
    for k, p in enumerate(net.collect_params().values()):
        seen[f"value{k}"] = p.data().asnumpy()
    if policy == "none" and not hooked:
        assert len(model.executors) == 1
    return seen


def test_word_lm_state_list_and_dropout_like_plain():
    """The state list in and out, Dropout in the RNN and around it, 3 steps: MXNet's
    executor (policy none) equals plain hybridized Gluon, and so does the hook."""
    plain = train_lm()
    assert_same(train_lm("none"), plain)
    assert_same(train_lm("sqrt", hooked=True), plain)


def test_tied_encoder_decoder_like_plain():
    assert_same(train_lm("none", tied=True), train_lm(tied=True))


def test_lm_plan_that_does_not_pay_is_said(caplog):
    show_log()
    log = logging.getLogger("mxmirror")
    log.addHandler(caplog.handler)
    try:
        train_lm("sqrt", hooked=True, steps=1)
    finally:
        log.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if "gluon" in r.getMessage()]
    assert len(lines) == 1 and "trained unplanned, the plan saves" in lines[0], lines
    assert "data0=12x4 data1=2x4x24 data2=2x4x24" in lines[0]


def lstm_layer(policy=None, keyword=True, steps=2) -> dict:
    """An rnn.LSTM layer itself, its states given by keyword (its own __call__ takes
    them) or left out (it makes zeros itself and returns no states)."""
    mx.random.seed(0)
    layer = rnn.LSTM(8, 1, input_size=5)
    layer.initialize(mx.init.Xavier())
    layer.hybridize()
    model = layer if policy is None else PlannedBlock(layer, policy)
    rs = np.random.RandomState(0)
    seen = {}
    for step in range(steps):
        x = mx.nd.array(rs.rand(6, 3, 5))
        with autograd.record():
            if keyword:
                out, states = model(x, states=layer.begin_state(batch_size=3))
                loss = out.sum() + (states[1] ** 2).sum()
            else:
                loss = model(x).sum()
        loss.backward()
        seen[f"loss{step}"] = loss.asnumpy()
        for k, p in enumerate(layer.collect_params().values()):
            seen[f"grad{step}.{k}"] = p.grad().asnumpy()
    return seen


def test_rnn_layer_with_keyword_states_like_plain():
    for keyword in (True, False):
        assert_same(lstm_layer("none", keyword), lstm_layer(None, keyword))


class DecoderStep(gluon.HybridBlock):
    """One step of a decoder: an LSTM cell and a few Dense layers (each followed by
    BatchNorm with `norm`, the last by Dropout with `drop`), called once per step."""

    def __init__(self, hidden: int = 16, depth: int = 2, norm: bool = False,
                 drop: float = 0.0, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.cell = rnn.LSTMCell(hidden, input_size=6)
            self.body = nn.HybridSequential()
            for _ in range(depth):
                self.body.add(nn.Dense(hidden, activation="tanh", in_units=hidden))
                if norm:
                    self.body.add(nn.BatchNorm(in_channels=hidden))
            if drop:
                self.body.add(nn.Dropout(drop))
            self.out = nn.Dense(7, in_units=hidden)

    def hybrid_forward(self, F, x, state):
        out, state = self.cell(x, state)
        return self.out(self.body(out)), state


def decoder_loop(policy=None, hooked=False, steps=2, T=10, B=3, encoder=True, hidden=16,
                 depth=2, blocks: list | None = None, lengths: list | None = None,
                 norm: bool = False, drop: float = 0.0) -> dict:
    """The seq2seq decoder's pattern: the hybridized step block called T times in one
    record(), its state fed from call to call; each step's input a slice of an encoder
    block's output (its gradient summed over the slices) and each step's output in the
    loss; the encoder's input needs its gradient too. Without the encoder, the slices of
    an input that needs none (scripts/gluon_step_loop.py's loop). `blocks` gets the step
    block; `lengths`: T of each record() (as many as steps), where they differ."""
    mx.random.seed(0)
    step_block = DecoderStep(hidden, depth, norm, drop)
    nets = [step_block] + ([nn.Dense(6, in_units=4, flatten=False)] if encoder else [])
    params = gluon.ParameterDict()
    for net in nets:
        net.initialize(mx.init.Xavier())
        net.hybridize()
        params.update(net.collect_params())
    if blocks is not None:
        blocks.append(step_block)
    model, encode = step_block, (nets[1] if encoder else None)
    if policy is not None and not hooked:
        model = PlannedBlock(step_block, policy)
        encode = encode and PlannedBlock(encode, policy)
    trainer = gluon.Trainer(params, "sgd", {"learning_rate": 0.1})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rs = np.random.RandomState(0)
    seen = {}
    with mxmirror.enabled(policy) if hooked else contextlib.nullcontext():
        for step in range(steps):
            T = lengths[step] if lengths else T
            x = mx.nd.array(rs.rand(T, B, 4 if encoder else 6))
            y = mx.nd.array(rs.randint(0, 7, (T, B)))
            if encoder:
                x.attach_grad()
            with autograd.record():
                seq = encode(x) if encoder else x
                state = step_block.cell.begin_state(batch_size=B)
                loss = 0
                for t in range(T):
                    out, state = model(seq[t], state)
                    loss = loss + loss_fn(out, y[t])
            loss.backward()
            read_step(seen, step, params.values(), loss=loss,
                      **({"dx": x.grad} if encoder else {}))
            trainer.step(B)
    for k, p in enumerate(params.values()):
        seen[f"value{k}"] = p.data().asnumpy()
    if policy == "none" and not hooked:  # one executor per step, reused every batch
        assert len(model.executors) == T and len(encode.executors) == 1
    return seen


def test_decoder_step_loop_like_plain():
    """T calls of one block in one record(), chained by their states, each reading a
    slice of a planned call's output: MXNet's executors (one per step, policy none) and
    the hook (whose plans do not pay here: trained unplanned) equal plain Gluon."""
    plain = decoder_loop()
    assert_same(decoder_loop("none"), plain)
    assert_same(decoder_loop("sqrt", hooked=True), plain)


LOOP = dict(encoder=False, B=64, hidden=32, depth=8)  # a plan that pays for one call alone


def _lines(run) -> list[str]:
    """The step block's lines mxmirror logs while `run()` runs, plans weighed without their
    executors' own structures (bound_regardless): these sizes test the other terms of the
    decision, sharing an executor against plain Gluon's kept values and gradient terms."""
    with log_lines() as lines, bound_regardless():
        run()
    return [line for line in lines if "decoderstep" in line]


@pytest.mark.parametrize("norm", [False, True])
def test_step_loop_shares_one_executor_like_plain(norm):
    """A step block whose plan pays for one call, where a further executor beside it would
    hold more than plain Gluon keeps for a call: the later calls share one executor, each
    call's backward running its forward again from the inputs it kept (the first call's
    signature has an executor of its own: its state needs no gradient). Every gradient,
    parameter and BatchNorm statistic equals plain Gluon's, for 3 and 4 calls (whose
    gradient sums are ElementWiseSum's) and 10 (chained)."""
    def run():
        for T in (3, 4, 10):
            blocks = []
            seen = decoder_loop("sqrt", hooked=True, T=T, norm=norm, **LOOP, blocks=blocks)
            assert len(mxmirror.gluon.hook.planned_for(blocks[0]).executors) == 2, T
            assert_same(seen, decoder_loop(T=T, norm=norm, **LOOP))

    lines = _lines(run)  # one for each T's block
    assert len(lines) == 3 and all("a further call in the same record() shares its executor"
                                   in line for line in lines), lines


def test_step_loop_with_dropout_trains_unplanned():
    """A step block that draws random numbers (Dropout) cannot run its forward again, so
    its calls cannot share an executor; a further executor beside the first would hold
    more than plain Gluon keeps: no executor is bound, the line says why, and the loop
    trains like plain Gluon. (Planning the first call alone and training the rest
    unplanned sums the Parameters' gradients otherwise than plain Gluon for 3 to 5 calls:
    measured.) Dropout's layout copies with MKL-DNN on would outweigh the plan alone
    (tests/test_gluon_layout.py): they are not counted here (_lines)."""
    def run():
        for T in (3, 4):
            blocks = []
            seen = decoder_loop("sqrt", hooked=True, T=T, drop=0.3, **LOOP, blocks=blocks)
            assert mxmirror.gluon.hook.planned_for(blocks[0]).executors == [], T
            assert_same(seen, decoder_loop(T=T, drop=0.3, **LOOP))

    lines = _lines(run)
    assert lines and all("a second call in the same record() would not pay" in line
                         for line in lines), lines


def test_block_called_once_per_record_is_planned_from_its_second():
    """The same block called once per record(): the plan pays for that call, so it is
    bound at the second record() (the first cannot know whether a second call follows)
    and trains like plain Gluon."""
    once = dict(LOOP, B=256, hidden=16, T=1, steps=3)
    blocks = []
    with bound_regardless():  # as _lines
        seen = decoder_loop("sqrt", hooked=True, **once, blocks=blocks)
    (executor,) = mxmirror.gluon.hook.planned_for(blocks[0]).executors
    assert executor.plan.mirrored
    assert_same(seen, decoder_loop(**once))


def test_block_called_once_per_record_then_several_times_in_one():
    """Records that called the block once each, then ones that call it 3 and 4 times: the
    first call of such a record() is planned (its plan pays), the second, whose signature
    differs (its state needs a gradient), gets an executor beside it though one does not
    pay there (a planned call followed by unplanned ones sums the Parameters' gradients
    otherwise than plain Gluon: measured), which the later calls share; one line says so,
    and every gradient and parameter equals plain Gluon's."""
    rare = dict(LOOP, B=256, hidden=16, lengths=[1, 1, 3, 1, 4, 1])
    blocks = []
    lines = _lines(lambda: blocks.append(
        decoder_loop("sqrt", hooked=True, steps=6, **rare, blocks=blocks)))
    assert_same(blocks[1], decoder_loop(steps=6, **rare))
    planned = mxmirror.gluon.hook.planned_for(blocks[0])
    assert len(planned.executors) == 2
    assert len(lines) == 1 and "a further call in the same record() shares its executor" \
        in lines[0], lines


def test_mkldnn_off_bit_identical():
    """With MKL-DNN off, MXNet 1.9.1's fused RNN op fails in plain hybridized Gluon itself
    (`Check failed: in_data.size() == num_inputs (4 vs. 3)`, and `out_data.size() ==
    num_outputs (3 vs. 1)` with dropout: measured), so only the decoder loop (an LSTM
    cell: no RNN op) has a reference there."""
    mkldnn_off.run_pytest(__file__, "decoder_step or step_loop or called_once", passed=6)
