"""What running one segment touches, resolved once: its template's slot arrays and where
each is filled from or emptied into.

The segmented executor runs hundreds of segment forwards per step; looking up slots by
name and kind on every run cost more Python than the MXNet calls themselves (issue 13,
item 6). ``SegmentSteps.build`` walks a segment's slots once; a run then iterates short
lists of arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from math import prod
from typing import Any

from mxmirror.runtime.segmented import engine_calls as calls
from mxmirror.segments.model import Segment


@dataclass
class SegmentSteps:
    """The arrays one segment's runs read and write, in its template executor."""

    ex: Any  # the template (an MXNet executor)
    # fillers (engine_calls.copier) copy a source into one slot, their C arguments built once
    states: list[tuple[Any, Any]]  # (boundary value entry, filler of its input slot)
    copies: list[Any]  # fill one slot from its parameter or statistic: copied in per run
    masks: list[tuple[int, Any]]  # (Dropout node, filler of its mask slot)
    keep: frozenset  # the values crossing the cut after this segment
    outputs: list[tuple]  # (boundary value, read by the next segment only)
    heads: list[tuple[int, Any]]  # (template output index, filler of the user's output)
    grad_inputs: list[tuple[str, Any, Any, Any]]  # (kind, key, slot, filler of the slot
    # through a view of the value's shape)
    param_grads: list[tuple[Any, Any]]  # (the user's gradient, its slot): accumulated
    zeroed: list[Any]  # shared gradient slots zeroed before each backward
    state_grads: list[tuple[Any, Any]]  # (boundary input entry, its gradient slot)
    aux_out: list[Any]  # copy a statistic slot out to the user's statistic
    aux_in: list[Any]  # fill a statistic slot from the user's statistic
    aux: list[Any]  # the template's statistics (ordered after its backward)
    value_bytes: dict  # boundary value entry -> bytes of the array holding it
    zeroers: dict = field(default_factory=dict)  # slots zeroed together -> engine_calls.zeroer

    def zero(self, slots: list) -> None:
        """Set these slot arrays (fixed per segment) to 0 in one engine op."""
        key = tuple(map(id, slots))
        run = self.zeroers.get(key)
        if run is None:
            run = self.zeroers[key] = calls.zeroer(slots)
        run()

    @classmethod
    def build(cls, seg: Segment, ex: Any, exe: Any, crossing: set, user_bound: set,
              grad_bound: set) -> SegmentSteps:
        """`exe`: the SegmentedExecutor (its user arrays, masks and grad_req); `user_bound`,
        `grad_bound`: (template, slot) bound to the user's value, and gradient."""
        args, grads, auxs = ex.arg_dict, ex.grad_dict, ex.aux_dict
        one_hop = exe.sg.one_hop
        states, copies, masks, grad_inputs, param_grads, state_grads, aux_out, aux_in = \
            [], [], [], [], [], [], [], []
        for name, key in seg.slots:
            kind = key[0]
            if kind == "state":  # filled from a kept flat value: through a view of that shape
                slot = args[name]
                states.append((key[1], calls.copier(slot.reshape((prod(slot.shape),)))))
                state_grads.append((key[1], grads[name]))
            elif kind == "arg":
                if (seg.key, name) not in user_bound:
                    copies.append(partial(calls.copier(args[name]), exe.arg_dict[key[1]]))
                if exe.req_of(key[1]) != "null" and (seg.key, name) not in grad_bound:
                    param_grads.append((exe.grad_dict[key[1]], grads[name]))
            elif kind == "aux":
                fill = partial(calls.copier(auxs[name]), exe.aux_dict[key[1]])
                copies.append(fill)
                aux_in.append(fill)
                aux_out.append(partial(calls.copier(exe.aux_dict[key[1]]), auxs[name]))
            elif kind == "mask":
                masks.append((key[1], calls.copier(args[name])))
            elif kind in ("ograd", "hgrad"):
                slot = args[name]
                shape = exe.value_shape(kind, key[1])
                view = slot if tuple(slot.shape) == shape else slot.reshape(shape)
                grad_inputs.append((kind, key[1], slot, calls.copier(view)))
        heads = [(len(seg.outputs) + j, calls.copier(exe.outputs[h]))
                 for j, h in enumerate(seg.heads)]
        outs = [ex.outputs[j] for j in range(len(seg.outputs))]
        value_bytes = {e: _nbytes(a) for e, a in zip(seg.outputs, outs)}
        outputs = [(e, e in one_hop) for e in seg.outputs]
        return cls(ex, states, copies, masks, frozenset(crossing), outputs, heads,
                   grad_inputs, param_grads, [g for _, g in param_grads], state_grads,
                   aux_out, aux_in, list(ex.aux_arrays), value_bytes)


def _nbytes(a: Any) -> int:
    import numpy as np

    return prod(a.shape) * np.dtype(a.dtype).itemsize


def zero(arrays: list) -> None:
    """Set `arrays` to 0 in one engine op (MXNet's reset_arrays, as Gluon's zero_grad)."""
    import mxnet as mx

    if arrays:
        mx.nd.reset_arrays(*arrays, num_arrays=len(arrays))


class _InTemplate:
    """A boundary value still in its template's output array (not copied out)."""

    __slots__ = ("array", "run")

    def __init__(self, array: Any, run: int) -> None:
        self.array, self.run = array, run


def _distinct(arrays: list) -> list:
    """`arrays` without repeats of the same NDArray (an engine op may not write one twice)."""
    seen: dict = {}
    for a in arrays:
        seen.setdefault(a.handle.value, a)
    return list(seen.values())


def _assign(dst: Any, value: Any) -> None:
    import mxnet as mx

    if isinstance(value, mx.nd.NDArray):
        value.copyto(dst)
    else:
        dst[:] = value
