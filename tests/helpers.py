"""What several test files need: a child process's environment, mxmirror's command line in a
child with frequent progress lines, MXNet's own figure of a bind in this process, dicts of
arrays compared name by name, mxmirror's log lines, what a training step leaves for a user
to read, and a plan bound whatever it saves."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator

import numpy as np

from mxmirror.adapter.children import allocated_mb
from mxmirror.adapter.executor_memory import OwnMemory
from tests.mkldnn_off import ROOT

# what a planned executor holds outside MXNet's figure, set to nothing: a test that compares
# what a plan computes binds it whatever it saves (bound_regardless)
NOTHING_OWN = OwnMemory(0, 0, 0)


def assert_planned(*models) -> None:
    """Every PlannedBlock among `models` (a plain block passes) ran its calls on planned
    executors: a comparison with plain Gluon is then not one of plain Gluon with itself."""
    for model in models:
        decisions = getattr(model, "decisions", None)
        if decisions is not None:
            assert decisions and all(used for _, used in decisions), \
                [(plan and plan.summary(), used) for plan, used in decisions]


@contextlib.contextmanager
def bound_regardless() -> Iterator[None]:
    """Plans bound whatever they save, by the bind hook and PlannedBlock: what a planned
    executor holds outside MXNet's figure (its nodes' structures, layout copies) counted as
    nothing, for tests that compare what a plan computes on graphs too small for a plan to
    pay (adapter/executor_memory.py; tests of that rule leave it on). The hook's kept
    verdicts are forgotten on the way in and out."""
    import mxmirror.gluon.signature as signature
    from mxmirror.frontends import hook

    saved = signature.beyond_cached_op, hook.beyond_unplanned
    signature.beyond_cached_op = hook.beyond_unplanned = lambda plan: NOTHING_OWN
    hook._plans.clear()
    try:
        yield
    finally:
        signature.beyond_cached_op, hook.beyond_unplanned = saved
        hook._plans.clear()


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child running this checkout's mxmirror: no MXMIRROR_* setting of
    the caller's, MXNet's subgraph chatter off, `extra` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXMIRROR_")}
    env["MXNET_SUBGRAPH_VERBOSE"] = "0"
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def cli_child(interval: float) -> list[str]:
    """The start of a child's argv running mxmirror's command line with a progress line every
    `interval` seconds (stderr not a terminal); the command's own arguments follow."""
    code = (f"import sys; from mxmirror import progress; progress.INTERVAL = {interval}; "
            "from mxmirror.frontends.cli import main; sys.exit(main(sys.argv[1:]))")
    return [sys.executable, "-c", code]


def mxnet_mb(sym, shapes: dict, grad_req=None, type_dict: dict | None = None) -> int:
    """MXNet's ``Total X MB allocated`` for a bind here (grad_req by default as Module binds:
    no gradient for the shaped inputs)."""
    import mxnet as mx

    if grad_req is None:
        grad_req = {a: ("null" if a in shapes else "write") for a in sym.list_arguments()}
    ex = sym.simple_bind(mx.cpu(), grad_req=grad_req, type_dict=type_dict, **shapes)
    return allocated_mb(ex)[0]


def assert_same(a: dict, b: dict, what: str,
                equal: Callable[[np.ndarray, np.ndarray], bool] = np.array_equal) -> None:
    """The same names in both, None in both or arrays `equal` (bitwise by default)."""
    assert set(a) == set(b), what
    bad = [k for k in a if (a[k] is None) != (b[k] is None)
           or (a[k] is not None and not equal(a[k].asnumpy(), b[k].asnumpy()))]
    assert not bad, f"{what} differ: {bad[:5]}"


@contextlib.contextmanager
def log_lines() -> Iterator[list[str]]:
    """The lines the ``mxmirror`` logger writes meanwhile (it stops propagating to the root
    logger, and so to caplog, once the hook shows its lines)."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("mxmirror")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def read_step(seen: dict, step: int, params, **arrays) -> None:
    """Into `seen`: the named arrays (loss, input gradients...) and every trained
    Parameter's gradient after step `step`, as NumPy arrays, keyed by position."""
    for name, a in arrays.items():
        seen[f"{name}{step}"] = a.asnumpy()
    for k, p in enumerate(params):
        if p.grad_req != "null":
            seen[f"grad{step}.{k}"] = p.grad().asnumpy()


def read_values(seen: dict, params) -> dict:
    """Into `seen`: every Parameter's value (BatchNorm statistics included); `seen`."""
    for k, p in enumerate(params):
        seen[f"value.{k}"] = p.data().asnumpy()
    return seen


def hooked_steps(sym, shapes: dict, policy: str | None, steps: int, classes: int,
                 lr: float = 0.0, seed: int | None = None) -> tuple[dict, list[str]]:
    """`steps` forward/backward steps of `sym` bound through Symbol.simple_bind with the bind
    hook on (policy None: "none", unplanned), from seeded arguments (labels drawn below
    `classes`; MXNet's random seed `seed` where given): the outputs and gradients at each
    step (and an SGD step of `lr` on the arguments, with their values at the end), and the
    op of every mirror copy MXNet's executor runs."""
    import mxnet as mx

    import mxmirror

    with mxmirror.enabled(policy or "none"):
        ex = sym.simple_bind(mx.cpu(), **shapes)
    rs = np.random.RandomState(0)
    for name, a in sorted(ex.arg_dict.items()):
        a[:] = rs.randint(0, classes, a.shape) if name == "softmax_label" else \
            rs.normal(0, 0.1, a.shape)
    if seed is not None:
        mx.random.seed(seed)
    seen = {}
    for step in range(steps):
        ex.forward(is_train=True)
        ex.backward()
        seen[f"out{step}"] = ex.outputs[0].asnumpy()
        for name, g in ex.grad_dict.items():
            if name not in shapes:
                seen[f"grad{step} {name}"] = g.asnumpy()
                if lr:
                    ex.arg_dict[name][:] -= lr * g
    if lr:
        seen.update({f"value {k}": v.asnumpy() for k, v in ex.arg_dict.items()})
    copies = [line[3:].split(",")[0] for line in ex.debug_str().splitlines()
              if line.startswith("Op:") and line.endswith("_mirror")]
    return seen, copies
