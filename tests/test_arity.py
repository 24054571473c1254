"""Templates of variadic ops rewritten for another arity equal the ones MXNet teaches at it.

A BucketingModule's buckets differ in the arity of Concat, SliceChannel, stack
(ir/arity.py): every rewrite here is compared, whole, with the template learned from MXNet
at the target arity, for each op with equal and with unequal shapes; and a spec whose
shapes coincide otherwise than the learned one's gets no rewrite.
"""

from __future__ import annotations

import pytest

from mxmirror.adapter.learn import learn
from mxmirror.ir import arity, backward

ARITIES = (2, 3, 7)


def _spec(op: str, attrs: dict, shapes: list, outs: list) -> dict:
    return {"op": op, "attrs": attrs, "shapes": [list(s) for s in shapes],
            "dtypes": ["float32"] * len(shapes), "aux": [], "num_visible": len(outs),
            "out_shapes": [list(s) for s in outs]}


CASES = {
    "Concat, equal steps": lambda k: _spec("Concat", {"dim": "1", "num_args": str(k)},
                                           [(4, 1, 6)] * k, [(4, k, 6)]),
    "Concat, unequal": lambda k: _spec("Concat", {"dim": "1", "num_args": str(k)},
                                       [(4, j + 1) for j in range(k)],
                                       [(4, k * (k + 1) // 2)]),
    "SliceChannel, squeezed steps": lambda k: _spec(
        "SliceChannel", {"axis": "1", "num_outputs": str(k), "squeeze_axis": "1"},
        [(4, k, 6)], [(4, 6)] * k),
    "SliceChannel, chunks": lambda k: _spec("SliceChannel", {"axis": "0", "num_outputs": str(k)},
                                            [(2 * k, 3)], [(2, 3)] * k),
    "stack": lambda k: _spec("stack", {"axis": "0", "num_args": str(k)}, [(4, 6)] * k,
                             [(k, 4, 6)]),
}


@pytest.fixture(scope="module")
def learned() -> dict[str, object]:
    """Every case at every arity, learned from MXNet in one child: signature -> template."""
    specs = [case(k) for case in CASES.values() for k in ARITIES]
    return {backward.key(sp): tpl for sp, tpl in zip(specs, learn(specs))}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rewrites_equal_learned_templates(learned, name) -> None:
    case = CASES[name]
    for n in ARITIES:
        source = {backward.key(case(n)): learned[backward.key(case(n))]}
        for m in ARITIES:
            sig = backward.key(case(m))
            got = arity.derive(source, {sig: case(m)})
            assert sig in got, (n, m)
            assert got[sig].to_json() == learned[sig].to_json(), (n, m)


def test_other_coincidences_and_ops_are_learned(learned) -> None:
    """Concat of equal steps serves no Concat of unequal inputs (nor the other way), and an
    op outside arity.VARIADIC is never rewritten (add_n: a `_copy` node per further input)."""
    equal, unequal = CASES["Concat, equal steps"], CASES["Concat, unequal"]
    source = {backward.key(equal(2)): learned[backward.key(equal(2))]}
    assert arity.derive(source, {backward.key(unequal(3)): unequal(3)}) == {}
    assert arity.family(backward.key(equal(3))) != arity.family(backward.key(unequal(3)))
    add_n = [_spec("add_n", {"num_args": str(k)}, [(4, 6)] * k, [(4, 6)]) for k in (2, 3)]
    two, three = learn(add_n)
    assert len(two.nodes) != len(three.nodes)
    assert arity.family(backward.key(add_n[0])) is None
