"""What running one segment touches, resolved once: its template's slot arrays and where
each is filled from or emptied into.

The segmented executor runs hundreds of segment forwards per step; looking up slots by
name and kind on every run cost more Python than the MXNet calls themselves (issue 13,
item 6). ``SegmentSteps.build`` walks a segment's slots once; a run then iterates short
lists of arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

from . import engine_calls as calls
from .segments import Segment


@dataclass
class SegmentSteps:
    """The arrays one segment's runs read and write, in its template executor."""

    ex: Any  # the template (an MXNet executor)
    states: list[tuple[Any, Any]]  # (boundary value entry, its input slot)
    copies: list[tuple[Any, Any]]  # (parameter or statistic, its slot): copied in per run
    masks: list[tuple[int, Any]]  # (Dropout node, its mask slot)
    keep: frozenset  # the values crossing the cut after this segment
    outputs: list[tuple]  # (boundary value, engine_calls.alloc_spec, read by the next only)
    heads: list[tuple[int, Any]]  # (template output index, the user's output array)
    grad_inputs: list[tuple[str, Any, Any, Any]]  # (kind, key, slot, slot as the value)
    param_grads: list[tuple[Any, Any]]  # (the user's gradient, its slot): accumulated
    zeroed: list[Any]  # shared gradient slots zeroed before each backward
    state_grads: list[tuple[Any, Any]]  # (boundary input entry, its gradient slot)
    aux_out: list[tuple[Any, Any]]  # (statistic slot, the user's statistic): copied out
    aux: list[Any]  # the template's statistics (ordered after its backward)
    value_bytes: dict  # boundary value entry -> bytes of the array holding it

    @classmethod
    def build(cls, seg: Segment, ex: Any, exe: Any, crossing: set, user_bound: set,
              grad_bound: set) -> SegmentSteps:
        """`exe`: the SegmentedExecutor (its user arrays, masks and grad_req); `user_bound`,
        `grad_bound`: (template, slot) bound to the user's value, and gradient."""
        args, grads, auxs = ex.arg_dict, ex.grad_dict, ex.aux_dict
        one_hop = exe.sg.one_hop
        states, copies, masks, grad_inputs, param_grads, state_grads, aux_out = \
            [], [], [], [], [], [], []
        for name, key in seg.slots:
            kind = key[0]
            if kind == "state":  # filled from a kept flat value: through a view of that shape
                slot = args[name]
                states.append((key[1], slot.reshape((prod(slot.shape),))))
                state_grads.append((key[1], grads[name]))
            elif kind == "arg":
                if (seg.key, name) not in user_bound:
                    copies.append((exe.arg_dict[key[1]], args[name]))
                if exe.req_of(key[1]) != "null" and (seg.key, name) not in grad_bound:
                    param_grads.append((exe.grad_dict[key[1]], grads[name]))
            elif kind == "aux":
                copies.append((exe.aux_dict[key[1]], auxs[name]))
                aux_out.append((auxs[name], exe.aux_dict[key[1]]))
            elif kind == "mask":
                masks.append((key[1], args[name]))
            elif kind in ("ograd", "hgrad"):
                slot = args[name]
                shape = exe.value_shape(kind, key[1])
                view = slot if tuple(slot.shape) == shape else slot.reshape(shape)
                grad_inputs.append((kind, key[1], slot, view))
        heads = [(len(seg.outputs) + j, exe.outputs[h]) for j, h in enumerate(seg.heads)]
        outs = [ex.outputs[j] for j in range(len(seg.outputs))]
        value_bytes = {e: _nbytes(a) for e, a in zip(seg.outputs, outs)}
        outputs = [(e, calls.alloc_spec(tuple(a.shape), a.dtype, exe.ctx), e in one_hop)
                   for e, a in zip(seg.outputs, outs)]
        return cls(ex, states, copies, masks, frozenset(crossing), outputs, heads,
                   grad_inputs, param_grads, [g for _, g in param_grads], state_grads,
                   aux_out, list(ex.aux_arrays), value_bytes)


def _nbytes(a: Any) -> int:
    import numpy as np

    return prod(a.shape) * np.dtype(a.dtype).itemsize


def zero(arrays: list) -> None:
    """Set `arrays` to 0 in one engine op (MXNet's reset_arrays, as Gluon's zero_grad)."""
    import mxnet as mx

    if arrays:
        mx.nd.reset_arrays(*arrays, num_arrays=len(arrays))
