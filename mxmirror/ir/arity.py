"""Templates of variadic ops at another arity, rewritten from one learned at some arity.

The buckets of an unrolled RNN differ in the arity of a few ops: the Concat of every
step's output, the SliceChannel of the embedded sequence (one output per step). MXNet's
gradient of these ops has one form at every arity (src/operator/nn/concat.cc ConcatGrad,
slice_channel.cc ElemwiseGradUseNone, matrix_op.cc stack): one backward node that reads
every input or every output gradient as a run and makes one input gradient per input.
So a template learned at arity n serves arity m once those runs are rewritten; a
template not of that form, or a spec whose shapes do not coincide as the learned one's did,
is learned again. tests/test_arity.py checks every rewrite against templates learned at
the target arity.
"""

from __future__ import annotations

import json
from dataclasses import replace

from mxmirror.ir.templates import Template, TemplateNode, hidden_ref

# op -> (the attribute that is its arity, what it counts: inputs or outputs)
# (add_n is not: its learned template has a `_copy` node per further input)
VARIADIC = {"Concat": ("num_args", "in"), "stack": ("num_args", "in"),
            "SliceChannel": ("num_outputs", "out")}


def family(signature: str) -> tuple[str, int] | None:
    """(what every arity of this op signature shares, its arity), or None where a rewrite
    does not apply: not variadic, auxiliary inputs, exact shapes, mixed ranks or dtypes."""
    sig = json.loads(signature)
    rule = VARIADIC.get(sig["op"])
    if rule is None or sig["aux"] or "shapes" in sig or len(set(sig["dtypes"])) > 1:
        return None
    attr, counts = rule
    if attr not in sig["attrs"] or len(set(sig["ndim"])) > 1:
        return None
    n_in, arity = sig["n"], int(sig["attrs"][attr])
    if n_in != (arity if counts == "in" else 1):
        return None
    same = {tuple(p) for p in sig["same"]}
    ins, outs = range(n_in), range(n_in, n_in + (1 if counts == "in" else arity))
    side, other = (ins, outs) if counts == "in" else (outs, ins)
    # how the shapes coincide, stated so that it does not depend on the arity
    pattern = (all((i, j) in same for i in side for j in side if i < j),
               any((min(i, j), max(i, j)) in same for i in side for j in other))
    attrs = {k: v for k, v in sig["attrs"].items() if k != attr}
    key = json.dumps([sig["op"], attrs, sig["ndim"][:1], sig["dtypes"][:1], pattern],
                     sort_keys=True)
    return key, arity


def rescaled(tpl: Template, spec: dict, n: int, m: int) -> Template | None:
    """`tpl`, learned at arity n, for `spec` of the same op at arity m; None where it is not
    of the uniform form (then m is learned). The forward outputs' shapes are referred to as
    learning refers to them (templates.hidden_ref), from the spec's shapes."""
    counts = VARIADIC[spec["op"]][1]
    if n < 2 or m < 1 or tpl.num_outputs != tpl.num_visible:  # hidden outputs: learn
        return None
    in_shapes = [tuple(x) for x in spec["shapes"]]
    out_shapes = [tuple(x) for x in spec["out_shapes"]]
    fwd_out_shapes = [hidden_ref(x, k, in_shapes, out_shapes) for k, x in enumerate(out_shapes)]
    if counts == "out":
        if tpl.num_outputs != n or len(out_shapes) != m:
            return None
        run, input_grads = "ograd", list(tpl.input_grads)
        num = {"num_outputs": m, "num_visible": m}
    else:
        if len(out_shapes) != tpl.num_outputs:
            return None
        run, num = "in", {}
        input_grads = _rescale_list(tpl.input_grads, n, m)
        if input_grads is None:
            return None
    nodes = []
    for tn in tpl.nodes:
        inputs, out_shapes = _rescale_run(tn.inputs, run, n, m), tn.out_shapes
        if counts == "in" and len(out_shapes) == n:
            out_shapes = _rescale_run(out_shapes, "in", n, m)
        if inputs is None or out_shapes is None:
            return None
        nodes.append(TemplateNode(tn.op, inputs, out_shapes, tn.control_fwd,
                                  list(tn.control_nodes), dict(tn.attrs)))
    out = replace(tpl, nodes=nodes, input_grads=input_grads, fwd_out_shapes=fwd_out_shapes,
                  **num)
    return out if _refs_in_range(out, m if counts == "in" else 1) else None


def _rescale_run(refs: list, kind: str, n: int, m: int) -> list | None:
    """The run (kind, 0), ..., (kind, n-1) in `refs` as (kind, 0), ..., (kind, m-1); refs of
    that kind outside the run: None."""
    at = [i for i, r in enumerate(refs) if r[0] == kind]
    if not at:
        return list(refs)
    lo = at[0]
    if at != list(range(lo, lo + n)) or [refs[i][1] for i in at] != list(range(n)):
        return None
    return [*refs[:lo], *[(kind, j) for j in range(m)], *refs[lo + n:]]


def _rescale_list(items: list, n: int, m: int) -> list | None:
    """A per-input list of length n at length m: ("node", t, j) for j < n."""
    if len(items) != n:
        return None
    t = items[0][1] if items[0] is not None and items[0][0] == "node" else None
    if t is not None and list(items) == [("node", t, j) for j in range(n)]:
        return [("node", t, j) for j in range(m)]
    return None


def _refs_in_range(tpl: Template, n_in: int) -> bool:
    """Every forward input and output a rewritten template reads exists at its arity, and
    every backward node output it reads is one its node makes."""
    made = [len(tn.out_shapes) for tn in tpl.nodes]
    refs = [r for tn in tpl.nodes for r in (*tn.inputs, *tn.out_shapes)]
    refs += [r for r in (*tpl.input_grads, *tpl.fwd_out_shapes) if r is not None]
    for r in refs:
        if (r[0] == "in" and r[1] >= n_in) or (r[0] in ("out", "ograd")
                                                and r[1] >= tpl.num_outputs):
            return False
        if r[0] == "node" and (r[1] >= len(made) or r[2] >= made[r[1]]):
            return False
    return True


def derive(table: dict[str, Template], wanted: dict[str, dict]) -> dict[str, Template]:
    """Templates for the `wanted` signatures (signature -> spec) rewritten from a template of
    the same variadic family in `table`."""
    by_family: dict[str, tuple[int, Template]] = {}
    for sig, tpl in table.items():
        fam = family(sig) if not tpl.literal else None
        if fam is not None and fam[0] not in by_family:
            by_family[fam[0]] = (fam[1], tpl)
    out = {}
    for sig, sp in wanted.items():
        fam = family(sig)
        if fam is None or fam[0] not in by_family:
            continue
        n, tpl = by_family[fam[0]]
        got = rescaled(tpl, sp, n, fam[1])
        if got is not None:
            out[sig] = got
    return out
