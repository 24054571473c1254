"""Gradient sums as MXNet 1.9.1's autograd makes them, term for term.

A gradient with several terms (a Parameter several calls train, an input several uses
read) is summed by the gradient pass's AggregateGradient (src/executor/graph_executor.cc):
ElementWiseSum below 8 terms, a chain of _grad_add from 8, in the order the pass lists the
terms. Floating-point addition is not associative, and ElementWiseSum's kernels for 3
and 4 terms round differently from adding one term at a time (measured: tests of
tests/test_gluon_calls.py fail otherwise), so the sums here reproduce both the operator
and the order. `RunningSum` takes the terms as the executors' backwards produce them,
from gradient arrays that may be reused for the next term, and keeps no more of them
than the sum needs.
"""

from __future__ import annotations

from typing import Any

from mxmirror.adapter.symbol import load_mxnet

CHAIN_FROM = 8  # MXNet sums fewer terms with one ElementWiseSum, from 8 with a _grad_add chain


def combine(terms: list) -> Any:
    """The sum MXNet's AggregateGradient makes of these terms, in this order: the term
    itself, ElementWiseSum of 3 or 4, or the terms added one at a time (2 terms,
    ElementWiseSum from 5, the _grad_add chain from 8)."""
    mx = load_mxnet()
    if len(terms) == 1:
        return terms[0]
    if len(terms) in (3, 4):
        return mx.nd.add_n(*terms)
    total = terms[0] + terms[1]
    for t in terms[2:]:
        total += t
    return total


def accumulate(dst: Any, old: Any, terms: list) -> None:
    """dst = old plus the terms, as MXNet adds a sum into a gradient with grad_req 'add'
    (kAddTo): the sum added to the old value, except ElementWiseSum of 5 to 7 terms, which
    adds each term to the old value in turn."""
    if 5 <= len(terms) < CHAIN_FROM:
        total = old + terms[0]
        for t in terms[1:]:
            total += t
        dst[:] = total
    else:
        dst[:] = old + combine(terms)


class RunningSum:
    """One gradient's terms, given in any order as they are computed, summed in `order`
    (the contributors' order in MXNet's sum): terms added one at a time as soon as every
    earlier one is in, a term that comes early copied when its array will be written
    again (`reused`), all of 3 or 4 terms kept for ElementWiseSum."""

    def __init__(self, order: list, old: Any = None) -> None:
        self.order = order
        self.kept: dict[int, Any] = {}
        self.next = 0
        self.total = None
        self.folded = 0
        self.old = old if 5 <= len(order) < CHAIN_FROM else None  # kAddTo of 5 to 7: from old

    def add(self, who: Any, term: Any, reused: bool) -> None:
        at = self.order.index(who)
        together = len(self.order) in (3, 4)
        # a reused array is copied unless it is added at once into a sum of our own
        first = self.total is None and self.old is None
        self.kept[at] = term.copy() if reused and (together or at != self.next or first) \
            else term
        while not together and self.next in self.kept:
            self._fold(self.kept.pop(self.next))
            self.next += 1

    def _fold(self, term: Any) -> None:
        if self.total is None and self.old is not None:
            self.total = self.old + term
        elif self.total is None:
            self.total = term
        elif self.folded == 1 and self.old is None:
            self.total = self.total + term  # the first term's array is not ours to add to
        else:
            self.total += term
        self.folded += 1

    def result(self) -> Any:
        """The sum (for grad_req 'add' with 5 to 7 terms: old plus the terms)."""
        if len(self.order) in (3, 4):
            return combine([self.kept[i] for i in range(len(self.order))])
        assert self.next == len(self.order), "a term of a gradient sum never came"
        return self.total
