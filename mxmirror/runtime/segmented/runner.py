"""A segment plan's operations (``segments.schedule``) replayed on its template executors.

Each operation runs one segment on its template: the state it runs from, its parameters,
statistics and Dropout masks copied into the template's slots, its outputs taken as the
next state; a backward hands each boundary gradient to the segment that made the value
and adds the parameter gradients into the user's. States are held and dropped where the
operations say, and the bytes of what is held are measured as the dry run counts them.

Correctness:
- BatchNorm: MXNet 1.9.1 updates running statistics in the backward pass, so
  each segment's backward, which runs exactly once per step, updates them once.
- Dropout: replaced in the sub-symbols by a multiplication with a mask input;
  the masks are drawn once per training forward with MXNet's own Dropout
  (on ones, in the graph's forward order), so every recomputation sees the
  same mask, and with the same seed the masks are bit-identical to those of an
  unplanned executor (tests/test_segmented.py).
- Parameter gradients are accumulated across segments (shared weights of an
  unrolled LSTM), honouring grad_req write/add/null: straight into the user's
  gradient where that sums as MXNet does (grad_sums.py), else through a slot.
- The gradient of a value read in several segments: each reader segment's block added
  as it comes, or held and added as MXNet's sum groups the terms (value_sums.py).
"""

from __future__ import annotations

from typing import Any

from mxmirror.runtime.aux_order import settle
from mxmirror.runtime.segmented import engine_calls as calls
from mxmirror.runtime.segmented.pool import Templates
from mxmirror.runtime.segmented.recycler import Recycler
from mxmirror.runtime.segmented.steps import SegmentSteps
from mxmirror.runtime.segmented.user_arrays import UserArrays
from mxmirror.segments.cost import SegmentPlan
from mxmirror.segments.schedule import Backward, Forward, Operation, backward_start, forward_only


class ScheduleRunner:
    """Runs a SegmentPlan's training forward, backward and inference forward."""

    def __init__(self, plan: SegmentPlan, ctx: Any, user: UserArrays,
                 templates: Templates) -> None:
        import mxnet as mx

        self._mx = mx
        self.ctx = ctx
        self.plan = plan
        self.sg = plan.segments
        self.user = user
        self.templates = templates
        ops = plan.operations
        split = backward_start(ops)
        self._training_forward, self._backward = ops[:split], ops[split:]
        self._inference = forward_only(self.sg.m)
        self.ones: dict[tuple, Any] = {}  # (shape, dtype) -> ones, what masks are drawn on
        self.masks: dict[int, Any] = {}  # Dropout node -> its mask for this step
        self._states: dict[int, dict] | None = None  # cut -> state; None: nothing to backprop
        self._train_mode: bool | None = None  # is_train of the last forward pushed
        self._head_grads: list | None = None
        self._grads: dict = {}
        self._parts: dict = {}  # value -> its partial gradient sums held (value_sums.Program)
        self._held: set[int] = set()  # cuts whose state is held
        self._held_refs: dict[int, int] = {}  # id of a held array -> held states holding it
        self._held_bytes = 0  # bytes of the distinct held arrays
        self._delivered: set = set()  # one-hop gradients already in their producer's slot
        self._segment_steps: dict[int, SegmentSteps] = {}
        self._value_bytes: dict = {}  # boundary value entry -> bytes of its arrays
        self._runs = 0  # template runs pushed (each may overwrite the pool)
        self.peak_kept_bytes = 0  # measured: bytes of kept values and gradients at the peak
        # the arrays holding them, reused within the plan's figure for them
        self.recycler = Recycler(plan.dry.peak_bytes)
        # the operations are the same every step: each kind (training, inference) is
        # measured on its first run only, sparing the bookkeeping on every later one
        self._measured: set[bool] = set()
        self._measuring = True
        self.forward_flops_run = 0.0  # measured: FLOPs of every segment forward executed
        # copies wait here and go as one engine call before the next other MXNet call
        self._copies = calls.Copies()

    @property
    def has_training_forward(self) -> bool:
        """Whether a training forward's states wait for a backward."""
        return self._states is not None

    def forward(self, is_train: bool) -> None:
        """The training forward (keeping the states the backward starts from), or an
        inference forward."""
        if self._train_mode not in (None, is_train):
            # MXNet stamps is_train on a template's ops when they are pushed and reads it when
            # they run: queued recomputations would run in the new mode; let them finish
            self._mx.nd.waitall()
        self._train_mode = is_train
        self._measuring = is_train not in self._measured
        self._draw_masks(is_train)
        self._states = None
        self._reset()
        states: dict[int, dict] = {0: {}}
        with self._mx.engine.bulk(calls.BULK):
            self._replay(self._training_forward if is_train else self._inference, states,
                         True, is_train)
            self._copies.push()
        # the training forward keeps the held states only (and cut 0's, which is empty)
        for c in [c for c in states if c and c not in self._held]:
            del states[c]
        if is_train:
            self._states = states
        else:
            self._measured.add(False)

    def backward(self, head_grads: list) -> None:
        """The backward from the training forward's states; `head_grads`: one per output
        (None: none given)."""
        write = [g for n, g in self.user.grad_dict.items() if self.user.grad_req[n] == "write"]
        _zero(_distinct(write))
        self._head_grads = head_grads
        states, self._states = self._states, None
        self._grads = {}
        with self._mx.engine.bulk(calls.BULK):
            self._replay(self._backward, states, False, True)
            self._copies.push()
        self._measured.add(True)
        self._reset()
        self._head_grads = None

    # -------------------------------------------------------------- replaying
    def _reset(self) -> None:
        """No boundary gradient alive, no state held, no copy pending (after an error)."""
        self._grads, self._parts = {}, {}
        self._copies = calls.Copies()
        self._held, self._held_refs, self._held_bytes = set(), {}, 0

    def _replay(self, ops: list[Operation], states: dict[int, dict], first: bool,
                is_train: bool) -> None:
        """Run `ops` on `states` (cut -> state); `first`: the forward that writes the
        user's outputs."""
        for op in ops:
            kind = type(op)
            if kind is Forward:
                i = op.segment
                states[i] = self._run_forward(i, states[i - 1], first, is_train)
                if i > 1 and i - 1 not in self._held:  # cut 0's state (empty) stays
                    del states[i - 1]
                if op.keep:
                    self._hold(i, states[i])
            elif kind is Backward:
                self._forward_backward(op.segment, states[op.segment - 1], op.rerun)
            else:
                self._release(op.cut, states.pop(op.cut))

    def _run_forward(self, i: int, state: dict, first: bool, is_train: bool) -> dict:
        st = self._steps(i)
        self._load(st, state)
        self._copies.push()
        calls.forward(st.ex, is_train)
        self._runs += 1
        self.forward_flops_run += self.sg.segments[i - 1].flops
        keep = st.keep
        new = {e: v for e, v in state.items() if e in keep}
        outs = st.ex.outputs
        add = self._copies.add
        for j, (e, one_hop, dtype, alloc) in enumerate(st.outputs):
            # a value only the next segment reads stays in the template's output until that
            # segment copies it into its slot (Segments.one_hop), unless its state is held
            if one_hop:
                new[e] = _InTemplate(outs[j], self._runs, dtype, alloc)
            else:
                new[e] = out = alloc()
                add(outs[j], out, dtype)
        if first:
            for j, user, dtype in st.heads:
                add(outs[j], user, dtype)
        self._note(state, new)
        return new

    def _hold(self, cut: int, state: dict) -> None:
        self._held.add(cut)
        refs, size = self._held_refs, self._value_bytes
        for e, v in list(state.items()):
            if type(v) is _InTemplate:  # kept: copied out of the template now
                array = self._in_place(v)
                state[e] = kept = v.alloc()
                self._copies.add(array, kept, v.dtype)
                v = kept
            if not self._measuring:
                continue
            n = refs.get(id(v), 0)
            if not n:
                self._held_bytes += size[e]
            refs[id(v)] = n + 1

    def _release(self, cut: int, state: dict) -> None:
        self._held.discard(cut)
        if not self._measuring:
            return
        refs, size = self._held_refs, self._value_bytes
        for e, v in state.items():
            n = refs.pop(id(v)) - 1
            if n:
                refs[id(v)] = n
            else:
                self._held_bytes -= size[e]

    def _forward_backward(self, i: int, state: dict, rerun: bool) -> None:
        st = self._steps(i)
        ex = st.ex
        copies = self._copies
        if rerun:
            self._load(st, state)
            copies.push()
            calls.forward(ex, True)
            self._runs += 1
            self.forward_flops_run += self.sg.segments[i - 1].flops
        else:  # the running statistics as they are now: another executor (a second call
            for copy in st.aux_in:  # of a Gluon block) may have updated them since
                copies.add(*copy)
        # shared parameter gradient slots: what the backward leaves unwritten is 0
        zeroed, negated = list(st.zeroed), []
        one_hop = self.sg.one_hop
        programs = self.sg.value_sums.programs
        for kind, key, slot, view, dtype in st.grad_inputs:
            if kind == "ograd" and key in programs and programs[key].root < 0:
                zeroed.append(slot)  # then -0, which adds nothing (Program)
                negated.append(slot)
            elif kind == "ograd" and key in one_hop:
                if key not in self._delivered:  # the reader's backward left none
                    zeroed.append(slot)
            else:
                g = self._grads.get(key) if kind == "ograd" else self._head_grads[key]
                if g is None:
                    zeroed.append(slot)
                else:
                    copies.add(g, view, dtype)
        st.zero(zeroed)  # slots no copy writes: the copies may wait
        for slot in negated:
            calls.negate(slot)
        self._delivered = set()
        copies.push()
        calls.backward(ex)
        self._runs += 1
        if st.aux:  # order the copy of the running statistics after BatchNorm's update
            settle(st.aux)
        grads = self._grads
        for e, g, dtype, alloc in st.state_grads:
            if e in programs:  # added to the other blocks as MXNet's sum groups them
                self._combine(e, programs[e], i, g, dtype, alloc)
            elif e in one_hop:  # straight into the producer's gradient input
                copies.add(g, self._hop_slot(i - 1, e), dtype)
                self._delivered.add(e)
            elif e in grads:  # reads a slot and a kept gradient no pending copy writes
                calls.add_to(grads[e], g)
            else:
                grads[e] = kept = alloc()
                copies.add(g, kept, dtype)
        for user, slot in st.param_grads:
            calls.add_to(user, slot)
        for copy in st.aux_out:
            copies.add(*copy)
        self._note(state)
        for e, *_ in st.outputs:
            grads.pop(e, None)

    def _combine(self, e: Any, program: Any, i: int, g: Any, dtype: Any, alloc: Any) -> None:
        """Segment i's block of value e's gradient (its slot g) into the program's partial
        sums: added to its sibling's while that is complete, else held; at the root, the
        producer's gradient input. A zero block (no leaf) is not used."""
        node = program.leaf.get(i)
        if node is None:
            return
        parts = self._parts.setdefault(e, {})
        array = None  # the block is still in its slot
        while node != program.root and program.sibling[node] in parts:
            partial = parts.pop(program.sibling[node])
            calls.add_to(partial, g if array is None else array)
            array, node = partial, program.parent[node]
        if array is None:
            array = alloc()
            self._copies.add(g, array, dtype)
        if node == program.root:
            self._grads[e] = array
            del self._parts[e]
        else:
            parts[node] = array

    def _in_place(self, value: _InTemplate) -> Any:
        """The template output holding `value`, which no run since has overwritten."""
        if value.run != self._runs:
            raise RuntimeError("mxmirror internal error: a boundary value left in its "
                               "template's output was read after another run")
        return value.array

    def _hop_slot(self, i: int, e: Any) -> Any:
        """Segment i's gradient-input slot for its output e (a view of e's shape)."""
        return next(view for kind, key, _, view, _ in self._steps(i).grad_inputs
                    if kind == "ograd" and key == e)

    def _note(self, *extra: dict) -> None:
        """Measured bytes of the kept values and boundary gradients (real NDArrays: each
        value's bytes are those of the template output it was copied from)."""
        if not self._measuring:
            return
        size, held = self._value_bytes, self._held_refs
        total = self._held_bytes + sum(size[e] for e in self._grads) + \
            sum(size[e] * len(p) for e, p in self._parts.items())
        seen: set = set()
        for d in extra:
            for e, v in d.items():
                if id(v) not in held and id(v) not in seen and type(v) is not _InTemplate:
                    seen.add(id(v))
                    total += size[e]
        if total > self.peak_kept_bytes:
            self.peak_kept_bytes = total

    # -------------------------------------------------------------- segments
    def _steps(self, i: int) -> SegmentSteps:
        """Segment i's slot arrays and their sources, resolved on its first run."""
        st = self._segment_steps.get(i)
        if st is None:
            seg = self.sg.segments[i - 1]
            st = self._segment_steps[i] = SegmentSteps.build(seg, self.sg, self.user,
                                                             self.templates, self.recycler)
            self._value_bytes.update(st.value_bytes)
        return st

    def _load(self, st: SegmentSteps, state: dict) -> None:
        add = self._copies.add
        for e, slot, dtype in st.states:
            value = state[e]
            add(self._in_place(value) if type(value) is _InTemplate else value, slot, dtype)
        for copy in st.copies:
            add(*copy)
        masks = self.masks
        for d, slot, dtype in st.masks:
            add(masks[d], slot, dtype)

    def _draw_masks(self, is_train: bool) -> None:
        mx = self._mx
        self.masks = {}
        graph = self.sg.graph
        for d in self.sg.dropouts:
            nd = graph.nodes[d]
            src, k = nd.inputs[0]
            shape = tuple(graph.nodes[src].shapes[k])
            dtype = graph.nodes[src].dtypes[k]
            ones = self.ones.get((shape, dtype))
            if ones is None:
                ones = self.ones[(shape, dtype)] = mx.nd.ones(shape, self.ctx, dtype=dtype)
            mode = nd.attrs.get("mode", "training")
            p = float(nd.attrs.get("p", "0.5"))
            if (not is_train and mode != "always") or p == 0.0:
                self.masks[d] = ones
                continue
            kw = {"p": p, "mode": "always"}
            if nd.attrs.get("axes") not in (None, "()", "[]"):
                kw["axes"] = nd.attrs["axes"]
            self.masks[d] = mx.nd.Dropout(ones, **kw)


class _InTemplate:
    """A boundary value still in its template's output array (not copied out): the run
    that made it, and how to copy it out (its dtype, an allocator of its shape)."""

    __slots__ = ("array", "run", "dtype", "alloc")

    def __init__(self, array: Any, run: int, dtype: Any, alloc: Any) -> None:
        self.array, self.run, self.dtype, self.alloc = array, run, dtype, alloc


def _distinct(arrays: list) -> list:
    """`arrays` without repeats of the same NDArray (an engine op may not write one twice)."""
    seen: dict = {}
    for a in arrays:
        seen.setdefault(a.handle.value, a)
    return list(seen.values())


def _zero(arrays: list) -> None:
    """Set `arrays` to 0 in one engine op (MXNet's reset_arrays, as Gluon's zero_grad)."""
    if arrays:
        import mxnet as mx

        mx.nd.reset_arrays(*arrays, num_arrays=len(arrays))
