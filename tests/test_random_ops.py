"""Random ops that mxmirror's op table did not know: MXNet's NumPy samplers (``_npi_*``,
whose gradient flows to their parameters), image augmentation, DGL sampling, and LeakyReLU
with ``act_type='rrelu'`` (ir/ops.py RANDOM, RANDOM_PREFIXES, RANDOM_IF; read from MXNet
1.9.1's source: every op asking for a random resource). A mirrored sampler draws anew in the
backward: scripts/unread_mirror_sweep.py measured ``_npi_pareto`` and ``_npi_weibull``
differing from plain with their copies read or not. They are never recomputed now.
"""

from __future__ import annotations

import json

import mxnet as mx
import numpy as np
import pytest
from mxnet.symbol.numpy import _internal as npi

import mxmirror
from mxmirror.ir import ops
from tests.helpers import bound_regardless, hooked_steps

BATCH, HIDDEN, STEPS = 16, 64, 3


@pytest.mark.parametrize("op", ["_npi_weibull", "_npi_pareto", "_npi_rayleigh",
                                "_npi_normal", "_image_random_brightness",
                                "_contrib_dgl_csr_neighbor_uniform_sample"])
def test_known_random(op):
    assert ops.is_random(op)


def test_rrelu_is_random_and_leaky_is_not():
    assert ops.is_random("LeakyReLU", {"act_type": "rrelu"})
    assert not ops.is_random("LeakyReLU", {"act_type": "leaky"})
    assert not ops.is_random("LeakyReLU")


def noisy_symbol() -> mx.sym.Symbol:
    """Dense layers whose outputs are scaled by Weibull noise drawn with shape relu(x) + 1
    (its gradient flows into the shape), SoftmaxOutput."""
    h = mx.sym.var("data")
    for i in range(4):
        h = mx.sym.FullyConnected(h, num_hidden=HIDDEN, name=f"fc{i}")
        noise = npi.weibull((mx.sym.relu(h) + 1).as_np_ndarray(), name=f"noise{i}")
        noise = noise.as_nd_ndarray()  # np.random.weibull, as a mx.np model draws it
        h = mx.sym.tanh(h * noise, name=f"tanh{i}")
    return mx.sym.SoftmaxOutput(mx.sym.FullyConnected(h, num_hidden=10, name="out"),
                                name="softmax")


def _train(policy: str | None) -> tuple[dict, list[str]]:
    return hooked_steps(noisy_symbol(), {"data": (BATCH, 8), "softmax_label": (BATCH,)},
                        policy, STEPS, 10, seed=3)


def test_samplers_are_not_recomputed():
    """Planned (sqrt, bound whatever it saves) training draws as plain training does: the
    plan recomputes the layers around the samplers, never a sampler."""
    plain, _ = _train(None)
    with bound_regardless():
        seen, copies = _train("sqrt")
    assert copies and "_npi_weibull" not in copies, copies
    bad = [k for k in plain if not np.array_equal(plain[k], seen[k])]
    assert not bad, bad[:5]
    p = mxmirror.plan(noisy_symbol(), "sqrt", data=(BATCH, 8), softmax_label=(BATCH,))
    nodes = json.loads(p.symbol.tojson())["nodes"]
    assert not [n["name"] for n in nodes if n["op"] == "_npi_weibull"
                and (n.get("attrs") or {}).get("__force_mirroring__")]
