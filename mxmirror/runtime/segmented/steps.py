"""What running one segment touches, resolved once: its template's slot arrays and where
each is filled from or emptied into.

The segmented executor runs hundreds of segment forwards per step; looking up slots by
name and kind on every run cost more Python than the MXNet calls themselves (issue 13,
item 6). ``SegmentSteps.build`` walks a segment's slots once; a run then iterates short
lists of arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np

from mxmirror.runtime.segmented import engine_calls as calls
from mxmirror.runtime.segmented.pool import Templates
from mxmirror.runtime.segmented.recycler import Recycler
from mxmirror.runtime.segmented.user_arrays import UserArrays
from mxmirror.segments.model import Segment, Segments


@dataclass
class SegmentSteps:
    """The arrays one segment's runs read and write, in its template executor. Each copy
    is (source, destination, dtype) or, where the source varies, (key, destination, dtype),
    pushed through engine_calls.Copies."""

    ex: Any  # the template (an MXNet executor)
    states: list[tuple[Any, Any, Any]]  # (boundary value entry, a flat view of its slot, dtype)
    copies: list[tuple[Any, ...]]  # a parameter or statistic into its slot, every run, with
    # the keys of the aliased arrays (engine_calls.Copies: statistics)
    masks: list[tuple[int, Any, Any]]  # (Dropout node, its mask slot, dtype)
    keep: frozenset  # the values crossing the cut after this segment
    outputs: list[tuple]  # (boundary value, read by the next segment only, dtype,
    # allocator of an array holding it out of the template)
    heads: list[tuple[int, Any, Any]]  # (template output index, the user's output, dtype)
    grad_inputs: list[tuple[str, Any, Any, Any, Any]]  # (kind, key, slot, a view of the
    # value's shape that is filled, dtype)
    param_grads: list[tuple[Any, Any]]  # (the user's gradient, its slot): accumulated
    zeroed: list[Any]  # shared gradient slots zeroed before each backward
    state_grads: list[tuple[Any, Any, Any, Any]]  # (boundary input entry, its gradient
    # slot, dtype, allocator of an array holding it out of the template)
    aux_out: list[tuple[Any, ...]]  # a statistic slot out to the user's statistic
    aux_in: list[tuple[Any, ...]]  # the user's statistic into its slot
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
    def build(cls, seg: Segment, sg: Segments, user: UserArrays, templates: Templates,
              recycler: Recycler) -> SegmentSteps:
        """What running segment `seg` of `sg` touches: its template's slots, and the user's
        arrays they are filled from or emptied into (none for a slot bound to the user's
        value or gradient: templates.user_bound, grad_bound); the arrays that hold its
        outputs and input gradients out of the template come from `recycler`."""
        ex = templates.executors[seg.key]
        user_bound, grad_bound = templates.user_bound, templates.grad_bound
        args, grads, auxs = ex.arg_dict, ex.grad_dict, ex.aux_dict
        types = sg.slot_types[seg.key]
        one_hop = sg.one_hop
        states, copies, masks, grad_inputs, param_grads, state_grads, aux_out, aux_in = \
            [], [], [], [], [], [], [], []
        for name, key in seg.slots:
            kind, dtype = key[0], np.dtype(types[name])
            if kind == "state":  # filled from a kept flat value: through a view of that shape
                slot = args[name]
                states.append((key[1], slot.reshape((prod(slot.shape),)), dtype))
                state_grads.append((key[1], grads[name], dtype, recycler.allocator(grads[name])))
            elif kind == "arg":
                if (seg.key, name) not in user_bound:
                    copies.append((user.arg_dict[key[1]], args[name], dtype, None, None))
                if user.grad_req[key[1]] != "null" and (seg.key, name) not in grad_bound:
                    param_grads.append((user.grad_dict[key[1]], grads[name]))
            elif kind == "aux":  # aliased: one slot per name, the user's (Copies)
                slot, mine = ("aux slot", name), ("user aux", key[1])
                fill = (user.aux_dict[key[1]], auxs[name], dtype, mine, slot)
                copies.append(fill)
                aux_in.append(fill)
                aux_out.append((auxs[name], user.aux_dict[key[1]], dtype, slot, mine))
            elif kind == "mask":
                masks.append((key[1], args[name], dtype))
            elif kind in ("ograd", "hgrad"):
                slot = args[name]
                shape = _gradient_shape(sg, kind, key[1])
                view = slot if tuple(slot.shape) == shape else slot.reshape(shape)
                grad_inputs.append((kind, key[1], slot, view, dtype))
        heads = [(len(seg.outputs) + j, user.outputs[h], np.dtype(user.outputs[h].dtype))
                 for j, h in enumerate(seg.heads)]
        outs = [ex.outputs[j] for j in range(len(seg.outputs))]
        value_bytes = {e: array_bytes(a) for e, a in zip(seg.outputs, outs)}
        outputs = [(e, e in one_hop, np.dtype(a.dtype), recycler.allocator(a))
                   for e, a in zip(seg.outputs, outs)]
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
    return prod(a.shape) * np.dtype(a.dtype).itemsize
