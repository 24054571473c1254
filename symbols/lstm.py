"""LSTM graphs for the memory experiments of Chen et al. 2016.

``paper_lstm`` is the unrolled LSTM of the paper's Fig. 6 and of memonger's
``example_lstm.py`` (one FullyConnected-built cell per layer and time step,
a classifier and loss at every step), so its memory can be compared with
the paper's.  ``ptb_lm`` is the word language model a BucketingModule
builds for one bucket with ``mx.rnn`` cells, for end-to-end training runs.
"""

from __future__ import annotations

import mxnet as mx

_LOSSES = ("softmax_cross_entropy", "SoftmaxOutput")
_BEGIN_STATES = ("zeros", "from_data")


def _lstm_cell(
    indata: mx.sym.Symbol,
    prev_c: mx.sym.Symbol,
    prev_h: mx.sym.Symbol,
    params: dict[str, mx.sym.Symbol],
    num_hidden: int,
    t: int,
    layer: int,
    memonger_tags: bool,
) -> tuple[mx.sym.Symbol, mx.sym.Symbol]:
    """One LSTM step written out from primitive ops; returns (next_c, next_h)."""
    p = f"t{t}_l{layer}"
    i2h, h2h = (mx.sym.FullyConnected(data=x, weight=params[f"{w}_weight"],
                                      bias=params[f"{w}_bias"], num_hidden=num_hidden * 4,
                                      name=f"{p}_{w}")
                for x, w in ((indata, "i2h"), (prev_h, "h2h")))
    gates = mx.sym.elemwise_add(i2h, h2h, name=f"{p}_gates")
    sliced = mx.sym.SliceChannel(gates, num_outputs=4, name=f"{p}_slice")
    in_gate = mx.sym.Activation(sliced[0], act_type="sigmoid", name=f"{p}_in_gate")
    in_transform = mx.sym.Activation(
        sliced[1], act_type="tanh", name=f"{p}_in_transform"
    )
    forget_gate = mx.sym.Activation(
        sliced[2], act_type="sigmoid", name=f"{p}_forget_gate"
    )
    out_gate = mx.sym.Activation(sliced[3], act_type="sigmoid", name=f"{p}_out_gate")
    next_c = mx.sym.elemwise_add(
        mx.sym.elemwise_mul(forget_gate, prev_c, name=f"{p}_forget_c"),
        mx.sym.elemwise_mul(in_gate, in_transform, name=f"{p}_in_c"),
        name=f"{p}_c",
    )
    c_act = mx.sym.Activation(next_c, act_type="tanh", name=f"{p}_c_tanh")
    next_h = mx.sym.elemwise_mul(out_gate, c_act, name=f"{p}_h")
    if memonger_tags:
        # Same stage number on c and h: memonger treats them as one cut line.
        next_c._set_attr(mirror_stage=str(t))
        next_h._set_attr(mirror_stage=str(t))
    return next_c, next_h


def paper_lstm(
    seq_len: int,
    num_layers: int = 4,
    num_hidden: int = 1024,
    num_embed: int = 1024,
    input_size: int = 50,
    num_classes: int = 5000,
    dropout: float = 0.0,
    memonger_tags: bool = False,
    loss: str = "softmax_cross_entropy",
) -> mx.sym.Symbol:
    """Unrolled ``num_layers`` x ``num_hidden`` LSTM with a loss at every step.

    Outputs: one loss per step, then the last c and h of every layer (under
    BlockGrad, for carrying state across truncated sequences).  With
    ``memonger_tags`` each step's next c and h carry ``mirror_stage=str(t)``.
    """
    if loss not in _LOSSES:
        raise ValueError(f"loss must be one of {_LOSSES}, got {loss!r}")
    if seq_len < 1 or num_layers < 1:
        raise ValueError(
            f"seq_len and num_layers must be >= 1, got {seq_len}, {num_layers}"
        )
    embed_weight = mx.sym.Variable("embed_weight")
    cls_weight = mx.sym.Variable("cls_weight")
    cls_bias = mx.sym.Variable("cls_bias")
    params = [
        {
            k: mx.sym.Variable(f"l{i}_{k}")
            for k in ("i2h_weight", "i2h_bias", "h2h_weight", "h2h_bias")
        }
        for i in range(num_layers)
    ]
    cs = [mx.sym.Variable(f"l{i}_init_c") for i in range(num_layers)]
    hs = [mx.sym.Variable(f"l{i}_init_h") for i in range(num_layers)]

    losses = []
    for t in range(seq_len):
        data = mx.sym.Variable(f"t{t}_data")
        hidden = mx.sym.FullyConnected(data=data, weight=embed_weight, no_bias=True,
                                       num_hidden=num_embed, name=f"t{t}_embed")
        for i in range(num_layers):
            if i > 0 and dropout > 0.0:
                hidden = mx.sym.Dropout(hidden, p=dropout, name=f"t{t}_l{i}_dropout")
            cs[i], hs[i] = _lstm_cell(
                hidden, cs[i], hs[i], params[i], num_hidden, t, i, memonger_tags
            )
            hidden = hs[i]
        if dropout > 0.0:
            hidden = mx.sym.Dropout(hidden, p=dropout, name=f"t{t}_cls_dropout")
        fc = mx.sym.FullyConnected(data=hidden, weight=cls_weight, bias=cls_bias,
                                   num_hidden=num_classes, name=f"t{t}_cls")
        label = mx.sym.Variable(f"t{t}_label")
        if loss == "softmax_cross_entropy":
            # softmax_cross_entropy is an ordinary op; MakeLoss makes it a head
            # that backward starts from without an explicit out_grad.
            ce = mx.sym.softmax_cross_entropy(fc, label, name=f"t{t}_ce")
            losses.append(mx.sym.MakeLoss(ce, name=f"t{t}_loss"))
        else:
            losses.append(mx.sym.SoftmaxOutput(data=fc, label=label, name=f"t{t}_sm"))

    last_c = [mx.sym.BlockGrad(c, name=f"l{i}_last_c") for i, c in enumerate(cs)]
    last_h = [mx.sym.BlockGrad(h, name=f"l{i}_last_h") for i, h in enumerate(hs)]
    return mx.sym.Group(losses + last_c + last_h)


def input_shapes(
    seq_len: int,
    batch_size: int,
    num_layers: int = 4,
    num_hidden: int = 1024,
    input_size: int = 50,
) -> dict[str, tuple[int, ...]]:
    """Shapes of every data, label and initial-state variable of ``paper_lstm``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for t in range(seq_len):
        shapes[f"t{t}_data"] = (batch_size, input_size)
        shapes[f"t{t}_label"] = (batch_size,)
    for i in range(num_layers):
        shapes[f"l{i}_init_c"] = (batch_size, num_hidden)
        shapes[f"l{i}_init_h"] = (batch_size, num_hidden)
    return shapes


def ptb_lm(
    seq_len: int,
    vocab_size: int,
    num_layers: int = 2,
    num_hidden: int = 200,
    num_embed: int = 200,
    dropout: float = 0.0,
    begin_state: str = "zeros",
    ignore_label: int | None = None,
) -> mx.sym.Symbol:
    """Word-level LSTM language model over ``data``/``softmax_label`` (batch, seq_len).

    This is the per-bucket graph of MXNet's bucketing example, so it can be
    handed to a BucketingModule's ``sym_gen``.  ``begin_state="zeros"`` keeps
    ``mx.rnn``'s default zero states (``_zeros`` ops without inputs);
    ``"from_data"`` builds the same zeros from ``data`` (``zeros_like`` of one
    column, broadcast to ``num_hidden``), a graph in which every op has an
    input.  With ``ignore_label`` the loss skips that label (bucket padding).
    """
    if begin_state not in _BEGIN_STATES:
        raise ValueError(f"begin_state must be one of {_BEGIN_STATES}, got {begin_state!r}")
    data = mx.sym.Variable("data")
    label = mx.sym.Variable("softmax_label")
    embed = mx.sym.Embedding(
        data=data, input_dim=vocab_size, output_dim=num_embed, name="embed"
    )
    stack = mx.rnn.SequentialRNNCell()
    for i in range(num_layers):
        stack.add(mx.rnn.LSTMCell(num_hidden=num_hidden, prefix=f"lstm_l{i}_"))
        if dropout > 0.0 and i < num_layers - 1:
            stack.add(mx.rnn.DropoutCell(dropout, prefix=f"lstm_d{i}_"))
    states = None
    if begin_state == "from_data":
        first = mx.sym.slice_axis(data, axis=1, begin=0, end=1, name="state_slice")
        zeros = mx.sym.zeros_like(first, name="state_zeros")
        zeros = mx.sym.broadcast_axis(zeros, axis=1, size=num_hidden, name="state_broadcast")
        states = [zeros] * len(stack.state_info)
    outputs, _ = stack.unroll(
        seq_len, inputs=embed, begin_state=states, layout="NTC", merge_outputs=True
    )
    if dropout > 0.0:
        outputs = mx.sym.Dropout(outputs, p=dropout, name="out_dropout")
    pred = mx.sym.Reshape(outputs, shape=(-1, num_hidden), name="pred_reshape")
    pred = mx.sym.FullyConnected(data=pred, num_hidden=vocab_size, name="pred")
    label = mx.sym.Reshape(label, shape=(-1,), name="label_reshape")
    if ignore_label is None:
        return mx.sym.SoftmaxOutput(data=pred, label=label, name="softmax")
    return mx.sym.SoftmaxOutput(
        data=pred, label=label, use_ignore=True, ignore_label=ignore_label, name="softmax"
    )
