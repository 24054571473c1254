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
from mxmirror.runtime.segmented.pool import Templates
from mxmirror.runtime.segmented.user_arrays import UserArrays
from mxmirror.segments.model import Segment, Segments


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
    def build(cls, seg: Segment, sg: Segments, user: UserArrays,
              templates: Templates) -> SegmentSteps:
        """What running segment `seg` of `sg` touches: its template's slots, and the user's
        arrays they are filled from or emptied into (none for a slot bound to the user's
        value or gradient: templates.user_bound, grad_bound)."""
        ex = templates.executors[seg.key]
        user_bound, grad_bound = templates.user_bound, templates.grad_bound
        args, grads, auxs = ex.arg_dict, ex.grad_dict, ex.aux_dict
        one_hop = sg.one_hop
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
                    copies.append(partial(calls.copier(args[name]), user.arg_dict[key[1]]))
                if user.grad_req[key[1]] != "null" and (seg.key, name) not in grad_bound:
                    param_grads.append((user.grad_dict[key[1]], grads[name]))
            elif kind == "aux":
                fill = partial(calls.copier(auxs[name]), user.aux_dict[key[1]])
                copies.append(fill)
                aux_in.append(fill)
                aux_out.append(partial(calls.copier(user.aux_dict[key[1]]), auxs[name]))
            elif kind == "mask":
                masks.append((key[1], calls.copier(args[name])))
            elif kind in ("ograd", "hgrad"):
                slot = args[name]
                shape = _gradient_shape(sg, kind, key[1])
                view = slot if tuple(slot.shape) == shape else slot.reshape(shape)
                grad_inputs.append((kind, key[1], slot, calls.copier(view)))
        heads = [(len(seg.outputs) + j, calls.copier(user.outputs[h]))
                 for j, h in enumerate(seg.heads)]
        outs = [ex.outputs[j] for j in range(len(seg.outputs))]
        value_bytes = {e: array_bytes(a) for e, a in zip(seg.outputs, outs)}
        outputs = [(e, e in one_hop) for e in seg.outputs]
        return cls(ex, states, copies, masks, sg.crossing[seg.index], outputs, heads,
                   grad_inputs, param_grads, [g for _, g in param_grads], state_grads,
                   aux_out, aux_in, list(ex.aux_arrays), value_bytes)


def _gradient_shape(sg: Segments, kind: str, key: Any) -> tuple:
    """The shape of the value a gradient-input slot ("ograd": boundary value entry,
    "hgrad": graph head index) holds the gradient of."""
    graph = sg.graph
    src, k = key if kind == "ograd" else graph.heads[key]
    return tuple(graph.nodes[src].shapes[k])


def array_bytes(a: Any) -> int:
    """Bytes of an NDArray's elements."""
    import numpy as np

    return prod(a.shape) * np.dtype(a.dtype).itemsize
