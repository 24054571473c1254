"""Child Python processes that run mxmirror: the one runner, and what their output says.

mxmirror binds in children whenever the parent must not pay for it: learning backward
templates (MXNET_MEM_PLAN_VERBOSE_LOGGING is read once per process), MXNet's figure of a
big graph (a bind leaves ~0.5 GB resident), a switch such as MXNET_BACKWARD_DO_MIRROR.
A child can be started early (``start_early``), before it is asked anything: its own
start-up (``import mxnet``, over a second) then overlaps the parent's.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, NoReturn

from mxmirror.progress import task

# the template learner: its module and settings (adapter/learn.py)
LEARNER = ("mxmirror.adapter.learn", {"MXNET_MEM_PLAN_VERBOSE_LOGGING": "1"})

_TOTAL_RE = re.compile(r"Total (\d+) MB allocated")
_PKG_PARENT = str(Path(__file__).resolve().parents[2])


class ChildFailed(Exception):
    """A child process exited with an error; ``tail`` is its last line of stderr."""

    def __init__(self, returncode: int, tail: str) -> None:
        super().__init__(tail)
        self.returncode, self.tail = returncode, tail


PROGRESS_LINE = "mxmirror: one more done"  # a child's line on stdout: a unit of its work done


def run_child(module: str, *args: str, stdin: str = "", what: str | None = None,
              total: int | None = None, unit: str = "", **settings: str) -> str:
    """Run ``python -m module args`` with `stdin` in child_env(**settings) and return its
    stdout; ChildFailed (with its last stderr line) if it fails. While it runs, progress
    reports `what` it does, counting the PROGRESS_LINE lines it prints of `total` `unit`s
    (a child that prints none shows the time it has taken). A child of the same module and
    settings started early (no arguments) is used, once."""
    what = what or f"running {module} in a child process"
    early = None if args else _early.pop(_key(module, settings), None)
    if early is not None and early[0].poll() is not None:  # it died: start another
        early[1].close()
        early = None
    proc, err = early or _start(module, args, settings)
    with task(what, total, unit) as done, err:
        try:
            feed = threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True)
            feed.start()
            out = []
            for line in proc.stdout:
                if line.rstrip("\n") == PROGRESS_LINE:
                    done.advance()
                else:
                    out.append(line)
            proc.wait()
            feed.join()
        except BaseException:  # Ctrl-C: the child goes too
            proc.kill()
            proc.wait()
            raise
        if proc.returncode != 0:
            err.seek(0)
            raise ChildFailed(proc.returncode, _tail(err.read()))
    return "".join(out)


def _start(module: str, args: tuple, settings: dict[str, str]) -> tuple:
    """``python -m module args`` started, its stderr to a file of its own."""
    err = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-m", module, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err, text=True,
                            env=child_env(**settings))
    return proc, err


_early: dict[tuple, tuple] = {}


def _key(module: str, settings: dict[str, str]) -> tuple:
    return (module, tuple(sorted(settings.items())))


def start_early(module: str, **settings: str) -> None:
    """Start ``python -m module`` now, reading its input only when run_child asks with the
    same module and settings; one never asked is stopped when this process exits."""
    key = _key(module, settings)
    if key in _early:
        return
    if not _early:
        atexit.register(_stop_early)
    _early[key] = _start(module, (), settings)


def _stop_early() -> None:
    while _early:
        proc, err = _early.popitem()[1]
        proc.kill()
        proc.communicate()
        err.close()


def finish(result: str) -> NoReturn:
    """In a child: print its result and end at once. MXNet's own teardown at exit (its engine
    and thread pools: about 0.2 s) is time the parent would wait for nothing."""
    print(result, flush=True)
    sys.stderr.flush()
    os._exit(0)


def one_more_done() -> None:
    """In a child: tell the parent's progress that one more unit of work is done."""
    print(PROGRESS_LINE, flush=True)


def _feed(pipe: Any, text: str) -> None:
    try:
        pipe.write(text)
        pipe.close()
    except (BrokenPipeError, OSError):  # the child ended early: its exit code says why
        pass


def last_json(stdout: str) -> Any:
    """The JSON value on a child's last line of output (ValueError if there is none)."""
    lines = stdout.strip().splitlines()
    if not lines:
        raise ValueError("no output")
    return json.loads(lines[-1])


def _tail(stderr: str) -> str:
    return (stderr.strip().splitlines() or ["no output"])[-1][:300]


def child_env(**settings: str) -> dict[str, str]:
    """The environment of a child running mxmirror: this package importable, MXNet's
    subgraph chatter off, the mirror switch off unless given, the bind hook off (a child's
    own binds, a learner's one-op graphs, are never planned: planning them would learn in a
    child again), plus `settings`."""
    env = dict(os.environ, MXNET_SUBGRAPH_VERBOSE="0")
    for key in ("MXNET_BACKWARD_DO_MIRROR", "MXNET_MEM_PLAN_VERBOSE_LOGGING",
                "MXMIRROR_POLICY", "MXMIRROR_BUDGET"):
        env.pop(key, None)
    env.update(settings)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_PARENT, env.get("PYTHONPATH")) if p)
    return env


def allocated_mb(debug_str: Any) -> list[int]:
    """Every ``Total X MB allocated`` in an executor's debug_str (or its text), in MB."""
    text = debug_str if isinstance(debug_str, str) else debug_str.debug_str()
    return [int(m) for m in _TOTAL_RE.findall(text)]


# MXNet's "[09:38:08] ../src/operator/nn/convolution.cc:151: " inside its messages
_LOG_PREFIX = re.compile(r"\[\d\d:\d\d:\d\d\]\s*\S+:\d+:\s*")


def error_line(exc: BaseException | str) -> str:
    """The one informative line of an MXNet error (no stack trace, no log prefix)."""
    text = exc if isinstance(exc, str) else str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if "Stack trace" not in ln and not ln.startswith(
        ("Traceback", "File ", "simple_bind error", "infer_type error", "infer_shape error"))]
    for ln in lines:
        if "Check failed" in ln or "Error" in ln:
            return _LOG_PREFIX.sub("", ln)[:300]
    name = exc if isinstance(exc, str) else type(exc).__name__
    return _LOG_PREFIX.sub("", lines[0] if lines else name)[:300]
