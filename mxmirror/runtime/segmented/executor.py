"""SegmentedExecutor: a segment plan run as a chain of MXNet executors on one memory pool.

Each template of a ``segments.SegmentPlan`` is bound as an ordinary MXNet
executor; all of them draw on one pool (``shared_exec``) owned by a small
forward-only executor. The values, parameters, BatchNorm statistics and Dropout
masks of a segment are copied into its template's slots before it runs, and
gradients and updated statistics copied back out after its backward.

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
"""

from __future__ import annotations

import warnings
from typing import Any

from mxmirror.adapter.children import allocated_mb
from mxmirror.errors import PlanError
from mxmirror.runtime.aux_order import settle
from mxmirror.runtime.binds import buffer_lends, leading_view, unhooked
from mxmirror.runtime.segmented import engine_calls as calls
from mxmirror.runtime.segmented.pool import pool_owner, slot_arrays
from mxmirror.runtime.segmented.steps import SegmentSteps, _assign, _distinct, _InTemplate, zero
from mxmirror.segments.cost import SegmentPlan
from mxmirror.segments.model import Segment
from mxmirror.segments.schedule import Driver, walk_backward, walk_forward


class SegmentedExecutor(Driver):
    """An executor with the ``mx.executor.Executor`` interface that runs a SegmentPlan."""

    def __init__(self, symbol: Any, ctx: Any, plan: SegmentPlan, grad_req: Any = "write",
                 args: dict | None = None, args_grad: dict | None = None,
                 aux_states: dict | None = None, shared_exec: Any = None,
                 shared_arg_names: list[str] | None = None,
                 shared_buffer: dict | None = None) -> None:
        import mxnet as mx

        self._mx = mx
        self._symbol = symbol
        self.ctx = ctx
        self.plan = plan
        sg = self.sg = plan.segments
        graph = sg.graph
        self._arg_names = symbol.list_arguments()
        self._aux_names = symbol.list_auxiliary_states()
        self._out_names = symbol.list_outputs()
        var = {n.name: n for n in graph.nodes if n.is_variable}
        shared_arg_names = set(shared_arg_names or [])
        sx = shared_exec
        self.arg_dict, self.grad_dict, self.aux_dict = {}, {}, {}
        self._req = {}
        for name in self._arg_names:
            nd = var[name]
            shape, dtype = nd.shapes[0], nd.dtypes[0]
            if args is not None and args.get(name) is not None:
                arr = args[name]
            elif sx is not None and name in shared_arg_names and name in sx.arg_dict:
                arr = sx.arg_dict[name]
            elif buffer_lends(shared_buffer, name, shape, dtype):
                arr = leading_view(shared_buffer[name], shape)
            else:
                arr = mx.nd.zeros(shape, ctx, dtype=dtype)
                if shared_buffer is not None and name not in shared_arg_names:
                    shared_buffer[name] = arr
            self.arg_dict[name] = arr
            req = nd.grad_req if nd.grad_req in ("write", "add", "null") else "write"
            self._req[name] = req
            if req == "null":
                self.grad_dict[name] = None
            elif args_grad is not None and args_grad.get(name) is not None:
                self.grad_dict[name] = args_grad[name]
            elif sx is not None and name in shared_arg_names and \
                    sx.grad_dict.get(name) is not None:
                self.grad_dict[name] = sx.grad_dict[name]
            else:
                self.grad_dict[name] = mx.nd.zeros(shape, ctx, dtype=dtype)
        for name in self._aux_names:
            nd = var[name]
            if aux_states is not None and aux_states.get(name) is not None:
                self.aux_dict[name] = aux_states[name]
            elif sx is not None and name in getattr(sx, "aux_dict", {}):
                self.aux_dict[name] = sx.aux_dict[name]
            else:
                self.aux_dict[name] = mx.nd.zeros(nd.shapes[0], ctx, dtype=nd.dtypes[0])
        self.outputs = [mx.nd.zeros(graph.nodes[h[0]].shapes[h[1]], ctx,
                                    dtype=graph.nodes[h[0]].dtypes[h[1]]) for h in graph.heads]
        # one executor per template, the largest first, all on its memory pool
        raw = unhooked("simple_bind")
        self._execs: dict[str, Any] = {}
        owner = self.pool_owner = pool_owner(plan, ctx, raw)  # None when nothing is pooled
        by_key = {seg.key: seg for seg in sg.segments}
        # activation slots of the same name share one array across templates (only one runs
        # at a time and every slot is filled right before its executor runs); a copy of the
        # dict per bind, as MXNet adds the arrays it allocates (parameter slots) to it
        self._slot_buffer = slot_arrays(sg, ctx)
        self._user_bound: set[tuple[str, str]] = set()  # (template, slot) on user arrays
        self._grad_bound: set[tuple[str, str]] = set()  # ... adding into the user's gradient
        for key in plan.bind_order():
            seg = by_key[key]
            sym = mx.sym.load_json(seg.json)
            buf = self._bind_buffer(seg)
            req = dict(sg.slot_req[key], **{n: "add" for k, n in self._grad_bound if k == key})
            ex = raw(sym, ctx, grad_req=req, type_dict=sg.slot_types[key],
                     shared_exec=owner, shared_buffer=buf, **sg.slot_shapes[key])
            owner = owner or ex
            self._execs[key] = ex
        self._ones: dict[tuple, Any] = {}
        self._masks: dict[int, Any] = {}
        self._stored: dict[int, dict] | None = None
        self._live: int | None = None
        self._train_mode: bool | None = None  # is_train of the last forward pushed
        self._head_grads: list | None = None
        self._grads: dict = {}
        self._held: dict[int, dict] = {}
        self._held_refs: dict[int, int] = {}  # id of a held array -> held states holding it
        self._held_bytes = 0  # bytes of the distinct held arrays
        self._delivered: set = set()  # one-hop gradients already in their producer's slot
        self._segment_steps: dict[int, SegmentSteps] = {}
        self._value_bytes: dict = {}  # boundary value entry -> bytes of its arrays
        self._runs = 0  # template runs pushed (each may overwrite the pool)
        self.peak_kept_bytes = 0  # measured: bytes of kept values and gradients at the peak
        # the walks are the same every step: each kind (training, inference) is measured
        # on its first run only, sparing the bookkeeping on every later one
        self._measured: set[bool] = set()
        self._measuring = True
        self.forward_flops_run = 0.0  # measured: FLOPs of every segment forward executed

    def _bind_buffer(self, seg: Segment) -> dict:
        """The shared_buffer one template binds with: the shared slots, and the user's own
        arrays for the parameter slots that read the same variable in every segment of the
        template (Segments.user_slots: no other segment's values take turns there), and
        the user's gradient where the template adds into it (Segments.grad_slots)."""
        import numpy as np

        buf = dict(self._slot_buffer)
        shapes, types = self.sg.slot_shapes[seg.key], self.sg.slot_types[seg.key]
        for name, key in seg.slots:
            if (seg.key, name) not in self.sg.user_slots:
                continue
            user = self.arg_dict[key[1]]
            if tuple(user.shape) == tuple(shapes[name]) and \
                    np.dtype(user.dtype) == np.dtype(types[name]):
                buf[name] = user
                self._user_bound.add((seg.key, name))
                if (seg.key, name) in self.sg.grad_slots:
                    # the template adds its gradient into the user's (grad_req 'add';
                    # backward zeroes the user's first where it asked for 'write')
                    buf["grad of " + name] = self.grad_dict[key[1]]
                    self._grad_bound.add((seg.key, name))
        return buf

    # -------------------------------------------------------------- interface
    @property
    def arg_arrays(self) -> list:
        return [self.arg_dict[n] for n in self._arg_names]

    @property
    def grad_arrays(self) -> list:
        return [self.grad_dict[n] for n in self._arg_names]

    @property
    def aux_arrays(self) -> list:
        return [self.aux_dict[n] for n in self._aux_names]

    @property
    def output_dict(self) -> dict:
        return dict(zip(self._out_names, self.outputs))

    def forward(self, is_train: bool = False, **kwargs: Any) -> list:
        for name, value in kwargs.items():
            if name not in self.arg_dict:
                raise ValueError(f"unknown argument {name!r}")
            _assign(self.arg_dict[name], value)
        if self._train_mode not in (None, is_train):
            # MXNet stamps is_train on a template's ops when they are pushed and reads it when
            # they run: queued recomputations would run in the new mode; let them finish
            self._mx.nd.waitall()
        self._train_mode = is_train
        self._measuring = is_train not in self._measured
        self._draw_masks(is_train)
        self._stored = None
        self._grads = {}
        self._held, self._held_refs, self._held_bytes = {}, {}, 0
        if is_train:
            with self._mx.engine.bulk(calls.BULK):
                self._stored = walk_forward(self, self.plan.tree, self.sg.m)
        else:
            state: dict = {}
            with self._mx.engine.bulk(calls.BULK):
                for i in range(1, self.sg.m + 1):
                    state = self._run_forward(i, state, True, False)
            self._live = None
            self._measured.add(False)
        return self.outputs

    def backward(self, out_grads: Any = None, is_train: bool = True) -> None:
        mx = self._mx
        if self._stored is None:
            raise PlanError("backward() needs a forward(is_train=True) first (the segmented "
                            "executor keeps only the states of one training forward)")
        if out_grads is None:
            out_grads = []
        elif isinstance(out_grads, mx.nd.NDArray):
            out_grads = [out_grads]
        elif isinstance(out_grads, dict):
            out_grads = [out_grads.get(n) for n in self._out_names]
        self._head_grads = list(out_grads) + [None] * (len(self.outputs) - len(out_grads))
        zero(_distinct([self.grad_dict[n] for n, r in self._req.items() if r == "write"]))
        stored, self._stored = self._stored, None
        self._grads = {}
        with mx.engine.bulk(calls.BULK):
            walk_backward(self, self.plan.tree, self.sg.m, stored)
        self._measured.add(True)
        self._grads = {}
        self._held, self._held_refs, self._held_bytes = {}, {}, 0
        self._head_grads = None

    def copy_params_from(self, arg_params: dict, aux_params: dict | None = None,
                         allow_extra_params: bool = False) -> None:
        for name, array in arg_params.items():
            if name in self.arg_dict:
                _assign(self.arg_dict[name], array)
            elif not allow_extra_params:
                raise ValueError(f"Find name \"{name}\" that is not in the arguments")
        for name, array in (aux_params or {}).items():
            if name in self.aux_dict:
                _assign(self.aux_dict[name], array)
            elif not allow_extra_params:
                raise ValueError(f"Find name \"{name}\" that is not in the auxiliary states")

    def set_monitor_callback(self, callback: Any, monitor_all: bool = False) -> None:
        warnings.warn("mxmirror: the segmented executor does not support monitor callbacks; "
                      "ignored", stacklevel=2)

    def reshape(self, partial_shaping: bool = False, allow_up_sizing: bool = False,
                **kwargs: Any):
        raise PlanError("the segmented executor cannot reshape: bind again with the new "
                        "shapes (mxmirror.simple_bind plans them afresh)")

    def debug_str(self) -> str:
        parts, total = [], 0
        for ex in self._execs.values():
            text = ex.debug_str()
            total += sum(allocated_mb(text))
            parts.append(text)
        head = (f"mxmirror segmented executor: {self.sg.m} segments, {len(self._execs)} "
                f"executors sharing one pool\nTotal {total} MB allocated (sum over the "
                f"executors)\n")
        return head + "\n".join(parts)

    @property
    def executors(self) -> dict:
        """The template executors (key -> MXNet executor), largest first."""
        return dict(self._execs)

    # -------------------------------------------------------------- running
    def _draw_masks(self, is_train: bool) -> None:
        mx = self._mx
        self._masks = {}
        graph = self.sg.graph
        for d in self.sg.dropouts:
            nd = graph.nodes[d]
            src, k = nd.inputs[0]
            shape = tuple(graph.nodes[src].shapes[k])
            dtype = graph.nodes[src].dtypes[k]
            ones = self._ones.get((shape, dtype))
            if ones is None:
                ones = self._ones[(shape, dtype)] = mx.nd.ones(shape, self.ctx, dtype=dtype)
            mode = nd.attrs.get("mode", "training")
            p = float(nd.attrs.get("p", "0.5"))
            if (not is_train and mode != "always") or p == 0.0:
                self._masks[d] = ones
                continue
            kw = {"p": p, "mode": "always"}
            if nd.attrs.get("axes") not in (None, "()", "[]"):
                kw["axes"] = nd.attrs["axes"]
            self._masks[d] = mx.nd.Dropout(ones, **kw)

    def req_of(self, name: str) -> str:
        """grad_req of argument `name` (write, add or null)."""
        return self._req[name]

    def value_shape(self, kind: str, key: Any) -> tuple:
        """The shape of the value a gradient-input slot ("ograd": boundary value entry,
        "hgrad": graph head index) holds the gradient of."""
        graph = self.sg.graph
        src, k = key if kind == "ograd" else graph.heads[key]
        return tuple(graph.nodes[src].shapes[k])

    def _steps(self, i: int) -> SegmentSteps:
        """Segment i's slot arrays and their sources, resolved on its first run."""
        st = self._segment_steps.get(i)
        if st is None:
            seg = self.sg.segments[i - 1]
            st = SegmentSteps.build(seg, self._execs[seg.key], self, self.sg.crossing[i],
                                    self._user_bound, self._grad_bound)
            self._segment_steps[i] = st
            self._value_bytes.update(st.value_bytes)
        return st

    def _load(self, st: SegmentSteps, state: dict) -> None:
        for e, fill in st.states:
            value = state[e]
            fill(self._in_place(value) if type(value) is _InTemplate else value)
        for fill in st.copies:
            fill()
        for d, fill in st.masks:
            fill(self._masks[d])

    def _run_forward(self, i: int, state: dict, first: bool, is_train: bool) -> dict:
        st = self._steps(i)
        self._load(st, state)
        calls.forward(st.ex, is_train)
        self._runs += 1
        self.forward_flops_run += self.sg.segments[i - 1].flops
        keep = st.keep
        new = {e: v for e, v in state.items() if e in keep}
        outs = st.ex.outputs
        for j, (e, one_hop) in enumerate(st.outputs):
            # a value only the next segment reads stays in the template's output until that
            # segment copies it into its slot (Segments.one_hop), unless its state is held
            new[e] = _InTemplate(outs[j], self._runs) if one_hop else calls.copy_new(outs[j])
        if first:
            for j, fill in st.heads:
                fill(outs[j])
        self._note(state, new)
        self._live = i if is_train else None
        return new

    def fwd(self, i: int, state: dict, first: bool) -> dict:
        return self._run_forward(i, state, first, True)

    def hold(self, state: dict) -> None:
        if id(state) in self._held:
            return
        self._held[id(state)] = state
        refs, size = self._held_refs, self._value_bytes
        for e, v in list(state.items()):
            if type(v) is _InTemplate:  # kept: copied out of the template now
                state[e] = v = calls.copy_new(self._in_place(v))
            if not self._measuring:
                continue
            n = refs.get(id(v), 0)
            if not n:
                self._held_bytes += size[e]
            refs[id(v)] = n + 1

    def release(self, state: dict) -> None:
        if self._held.pop(id(state), None) is None or not self._measuring:
            return
        refs, size = self._held_refs, self._value_bytes
        for e, v in state.items():
            n = refs.pop(id(v)) - 1
            if n:
                refs[id(v)] = n
            else:
                self._held_bytes -= size[e]

    def forward_backward(self, i: int, state: dict) -> None:
        st = self._steps(i)
        ex = st.ex
        if self._live != i:
            self._load(st, state)
            calls.forward(ex, True)
            self._runs += 1
            self.forward_flops_run += self.sg.segments[i - 1].flops
        else:  # the running statistics as they are now: another executor (a second call
            for fill in st.aux_in:  # of a Gluon block) may have updated them since
                fill()
        self._live = None
        # shared parameter gradient slots: what the backward leaves unwritten is 0
        zeroed = list(st.zeroed)
        one_hop = self.sg.one_hop
        for kind, key, slot, fill in st.grad_inputs:
            if kind == "ograd" and key in one_hop:
                if key not in self._delivered:  # the reader's backward left none
                    zeroed.append(slot)
            else:
                g = self._grads.get(key) if kind == "ograd" else self._head_grads[key]
                if g is None:
                    zeroed.append(slot)
                else:
                    fill(g)
        st.zero(zeroed)
        self._delivered = set()
        calls.backward(ex)
        self._runs += 1
        if st.aux:  # order the copy of the running statistics after BatchNorm's update
            settle(st.aux)
        for e, g in st.state_grads:
            if e in one_hop:  # straight into the producer's gradient input
                self._hop_fill(i - 1, e)(g)
                self._delivered.add(e)
            elif e in self._grads:
                calls.add_to(self._grads[e], g)
            else:
                self._grads[e] = calls.copy_new(g)
        for user, slot in st.param_grads:
            calls.add_to(user, slot)
        for fill in st.aux_out:
            fill()
        self._note(state)
        for e, _ in st.outputs:
            self._grads.pop(e, None)

    def _in_place(self, value: _InTemplate) -> Any:
        """The template output holding `value`, which no run since has overwritten."""
        if value.run != self._runs:
            raise RuntimeError("mxmirror internal error: a boundary value left in its "
                               "template's output was read after another run")
        return value.array

    def _hop_fill(self, i: int, e: Any) -> Any:
        """The filler of segment i's gradient-input slot for its output e."""
        return next(fill for kind, key, _, fill in self._steps(i).grad_inputs
                    if kind == "ograd" and key == e)

    def _note(self, *extra: dict) -> None:
        """Measured bytes of the kept values and boundary gradients (real NDArrays: each
        value's bytes are those of the template output it was copied from)."""
        if not self._measuring:
            return
        size, held = self._value_bytes, self._held_refs
        total = self._held_bytes + sum(size[e] for e in self._grads)
        seen: set = set()
        for d in extra:
            for e, v in d.items():
                if id(v) not in held and id(v) not in seen and type(v) is not _InTemplate:
                    seen.add(id(v))
                    total += size[e]
        if total > self.peak_kept_bytes:
            self.peak_kept_bytes = total


