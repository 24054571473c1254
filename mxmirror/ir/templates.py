"""Backward templates: what MXNet's gradient pass builds for one forward node.

MXNet's ``FGradient`` of an op creates a few backward nodes whose inputs are the
output gradients, the forward node's inputs and outputs, and each other. A
template records that structure once per op signature (learned from MXNet
itself, see ``adapter/learn.py``), so the simulator can rebuild MXNet's training graph
for any network without binding it. A ``TemplateTable`` holds the templates of a graph's
signatures; attaching them (``ir.backward.attach``) is a look-up, never a bind.

A reference (``Ref``) is a tuple:
  ("ograd", i)        gradient flowing into forward output i
  ("in", j)           forward input j (of the mirror copy when mirrored)
  ("out", k)          forward output k (of the mirror copy when mirrored)
  ("node", t, k)      output k of backward node t of this template
A shape reference is ("in", j), ("out", k) or ("lit", (d0, d1, ...)).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache

Ref = tuple


@dataclass
class TemplateNode:
    """One backward node created by the op's FGradient."""

    op: str
    inputs: list[Ref]
    out_shapes: list[Ref]
    control_fwd: bool = True  # control dependency on the forward node
    control_nodes: list[int] = field(default_factory=list)  # on earlier template nodes
    attrs: dict[str, str] = field(default_factory=dict)


@dataclass
class Template:
    """Backward structure of one forward op signature."""

    op: str
    num_outputs: int  # all outputs of the forward node, hidden ones included
    num_visible: int
    nodes: list[TemplateNode]
    input_grads: list[Ref | None]  # per forward input: where its gradient comes from
    literal: bool = False  # some shape was not relative to the forward node's entries
    fwd_out_shapes: list[Ref] = field(default_factory=list)  # every forward output, hidden too

    def to_json(self) -> dict:
        return {
            "op": self.op, "num_outputs": self.num_outputs, "num_visible": self.num_visible,
            "literal": self.literal,
            "nodes": [
                {"op": n.op, "inputs": [list(r) for r in n.inputs],
                 "out_shapes": [_shape_ref_json(s) for s in n.out_shapes],
                 "control_fwd": n.control_fwd, "control_nodes": n.control_nodes,
                 "attrs": n.attrs}
                for n in self.nodes
            ],
            "input_grads": [None if r is None else list(r) for r in self.input_grads],
            "fwd_out_shapes": [_shape_ref_json(s) for s in self.fwd_out_shapes],
        }

    @classmethod
    def from_json(cls, d: dict) -> Template:
        return cls(
            op=d["op"], num_outputs=d["num_outputs"], num_visible=d["num_visible"],
            literal=d.get("literal", False),
            nodes=[
                TemplateNode(op=n["op"], inputs=[tuple(r) for r in n["inputs"]],
                             out_shapes=[_shape_ref_from_json(s) for s in n["out_shapes"]],
                             control_fwd=n["control_fwd"], control_nodes=n["control_nodes"],
                             attrs=n.get("attrs", {}))
                for n in d["nodes"]
            ],
            input_grads=[None if r is None else tuple(r) for r in d["input_grads"]],
            fwd_out_shapes=[_shape_ref_from_json(s) for s in d.get("fwd_out_shapes", [])],
        )


def _shape_ref_json(s: Ref) -> list:
    return [s[0], list(s[1])] if s[0] == "lit" else list(s)


def _shape_ref_from_json(s: list) -> Ref:
    return ("lit", tuple(s[1])) if s[0] == "lit" else tuple(s)


def shape_ref(shape: tuple, in_shapes: list[tuple], out_shapes: list[tuple],
               prefer_in: int | None = None) -> tuple:
    """A backward node's output shape: like input `prefer_in`, else like the first equal
    input, else like the first equal forward output, else literal."""
    if prefer_in is not None and prefer_in < len(in_shapes) and in_shapes[prefer_in] == shape:
        return ("in", prefer_in)
    for j, s in enumerate(in_shapes):
        if s == shape:
            return ("in", j)
    for k, s in enumerate(out_shapes):
        if s == shape:
            return ("out", k)
    return ("lit", shape)


def hidden_ref(shape: tuple, k: int, in_shapes: list[tuple], out_shapes: list[tuple]) -> tuple:
    """A forward output's shape: like an earlier output first (a workspace, a mask), then
    like an input (BatchNorm's mean and variance are like gamma), else literal."""
    for j, s in enumerate(out_shapes[:k]):
        if s == shape:
            return ("out", j)
    return shape_ref(shape, in_shapes, [])


# Attributes that only size tensors: the backward structure does not depend on them.
SIZE_ATTRS = {
    "num_filter", "num_hidden", "kernel", "stride", "pad", "dilate", "workspace",
    "eps", "momentum", "scalar", "slope", "shape", "target_shape", "cudnn_tune",
    "cudnn_off", "input_dim", "output_dim", "reps", "repeats", "begin", "end", "step",
    "lower_bound", "upper_bound", "a_min", "a_max", "lr_mult", "wd_mult",
}


def signature(op: str, attrs: dict[str, str], in_shapes: list[tuple], aux: list[int],
              dtypes: list[str], literal: bool = False, out_shapes: list[tuple] = ()) -> str:
    """Cache key of an op signature; exact shapes only for templates that need them.

    Which input and output shapes are equal is part of the key: a template records a
    hidden output's shape as "like input j" or "like output k", and that is only
    unambiguous among nodes whose shapes coincide the same way (a stride-1 max pooling
    learned where input and output agree must not serve a strided one).
    """
    kept = tuple((k, v) for k, v in sorted(attrs.items())
                 if not k.startswith("__") and k not in SIZE_ATTRS and k != "ctx_group")
    return _signature(op, kept, tuple(map(tuple, in_shapes)), tuple(aux), tuple(dtypes),
                      literal, tuple(map(tuple, out_shapes)))


@lru_cache(maxsize=4096)  # an unrolled network repeats a few signatures thousands of times
def _signature(op: str, kept: tuple, in_shapes: tuple, aux: tuple, dtypes: tuple,
               literal: bool, out_shapes: tuple) -> str:
    shapes = list(in_shapes + out_shapes)
    same = [[i, j] for i in range(len(shapes)) for j in range(i + 1, len(shapes))
            if shapes[i] == shapes[j]]
    key = {"op": op, "attrs": dict(kept), "n": len(in_shapes), "aux": list(aux),
           "ndim": [len(s) for s in in_shapes], "dtypes": list(dtypes), "same": same}
    if literal:
        key["shapes"] = [list(s) for s in in_shapes]
    return json.dumps(key, sort_keys=True)


TemplateTable = dict[str, Template]  # signature -> template
