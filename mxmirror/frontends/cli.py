"""The mxmirror command: plan, memory, viz, fit, run, demo.

Bad input ends with exit code 2 and one last stderr line ``mxmirror: error: ...``;
MXNet's own log noise is kept out of error output.
"""

from __future__ import annotations

import argparse
import builtins
import json
import os
import sys
import tokenize
import types
from pathlib import Path

from mxmirror.adapter.figure import mxnet_mb_many
from mxmirror.adapter.symbol import load_mxnet, load_symbol, read_symbol, symbol_json
from mxmirror.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, PlanError
from mxmirror.log import mb_text
from mxmirror.progress import task

EXIT_BROKEN_PIPE = 128 + 13  # as a process ended by SIGPIPE (13) reports itself to the shell


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, where it has one."""

    def _get_help_string(self, action):
        if action.default in (None, [], False):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # argparse's own errors: same contract
        self.print_usage(sys.stderr)
        raise PlanError(message)


def _dims(text: str, form: str, example: str, separators: str = ",") -> tuple[str, list[str]]:
    """NAME=D0,D1,...: the name and the dimensions' texts, none of them empty."""
    name, eq, dims = text.partition("=")
    if not eq or not name.strip():
        raise PlanError(f"--shape takes NAME={form}, e.g. data={example}; got {text!r}")
    if not dims.strip():
        raise PlanError(f"--shape {text!r}: no dimensions")
    for sep in separators[1:]:
        dims = dims.replace(sep, separators[0])
    out = [d.strip() for d in dims.split(separators[0])]
    if "" in out:
        raise PlanError(f"--shape {text!r}: dimension {out.index('') + 1} is empty"
                        + (f" ({' and '.join(map(repr, separators))} separate dimensions)"
                           if len(separators) > 1 else ""))
    return name.strip(), out


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, dims = _dims(text, "D0,D1,...", "32,3,224,224", ",x")
    try:
        shape = tuple(int(d) for d in dims)
    except ValueError:
        raise PlanError(f"--shape {text!r}: dimensions must be integers") from None
    if any(d <= 0 for d in shape):
        raise PlanError(f"--shape {text!r}: dimensions must be positive integers")
    return name, shape


def _once(option: str, items: list[str], parse) -> dict:
    """NAME -> value of each `parse(item)`'s (NAME, value) pairs: each input named once."""
    out, given = {}, {}
    for item in items:
        for name, value in parse(item):
            if name in out:
                raise PlanError(f"{option} for input {name!r} given twice ({given[name]!r}, "
                                f"then {item!r}): give each input one {option}")
            out[name], given[name] = value, item
    return out


def _shapes(items: list[str], parse=_shape) -> dict[str, tuple]:
    return _once("--shape", items, lambda item: [parse(item)])


def _dtype(args, shaped) -> dict[str, str] | None:
    """--dtype [NAME=]DTYPE, each input once; no NAME: each of the `shaped` inputs."""
    def parse(item: str) -> list[tuple[str, str]]:
        name, eq, dt = item.rpartition("=")
        if eq and not name.strip():
            raise PlanError(f"--dtype takes [NAME=]DTYPE, e.g. float16 or data=float16; "
                            f"got {item!r}")
        return [(n, dt) for n in ([name.strip()] if eq else shaped)]

    return _once("--dtype", args.dtype, parse) or None


def _plan_options(p: argparse.ArgumentParser) -> None:
    """--policy and --budget, with the policy names of the one registry."""
    from mxmirror.planning.registry import NEEDS_BUDGET, POLICIES

    p.add_argument("--policy", default="sqrt", choices=list(POLICIES),
                   help="what to recompute (default: %(default)s)")
    p.add_argument("--budget", default=None, metavar="SIZE",
                   help=f"memory budget such as 800MB or 1.5GB: required by --policy "
                        f"{' and '.join(NEEDS_BUDGET)}; for auto, instead of the free memory "
                        f"it measures; no other policy takes one")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("symbol", help="symbol JSON file (sym.save())")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="input shape; repeat for each input (at least the data input)")
    p.add_argument("--dtype", action="append", default=[], metavar="[NAME=]DTYPE",
                   help="input dtype (default float32); without NAME: every shaped input")
    _plan_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    from mxmirror.planning.registry import POLICIES
    from mxmirror.tools import fitting

    parser = _Parser(prog="mxmirror", description="Sublinear-memory plans for MXNet 1.9.1.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    p = sub.add_parser("plan", help="plan a symbol and print or save the planned symbol")
    _common(p)
    p.add_argument("--out", metavar="PLANNED.json", help="write the planned symbol JSON here")
    p.add_argument("--gpu", action="store_true", help="plan for binding on a GPU (recomputed "
                   "copies cuDNN's BatchNorm would refuse are kept back)")
    p = sub.add_parser("memory", help="simulated MB per strategy and MXNet's own figure")
    _common(p)
    p.add_argument("--no-bind", action="store_true", help="skip MXNet's own figure")
    p = sub.add_parser("viz", help="draw the plan (graphviz) and its memory timeline")
    _common(p)
    p.add_argument("-o", "--output", help="graph drawing: FILE.dot|.gv|.svg|.pdf|.png")
    p.add_argument("--collapse", default="auto", metavar="MODE",
                   help="auto (every op node of a small graph, else one box per block, or "
                        "per segment where blocks are still too many), none (every op "
                        "node), block (one box per residual unit / LSTM step), segment (one "
                        "box per segment), prefix:N (one box per run of names sharing "
                        "their first N '_' parts)")
    p.add_argument("--timeline", metavar="FILE.png",
                   help="also plot live memory over the training step, no plan vs the plan")
    p = sub.add_parser("fit", help="the largest batch (or depth) that fits a memory size, "
                                   "per policy")
    p.add_argument("symbol", nargs="?", help="symbol JSON file (sym.save()); or --depth")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=N,D1,...",
                   help="input shape with the batch written as N; repeat for each input")
    p.add_argument("--dtype", action="append", default=[], metavar="[NAME=]DTYPE",
                   help="input dtype (default float32); without NAME: every shaped input")
    p.add_argument("--memory", required=True, metavar="SIZE", help="memory to fit in, e.g. 12GB")
    p.add_argument("--policy", choices=list(POLICIES),
                   help=f"one policy (default: each of {', '.join(fitting.POLICIES)})")
    p.add_argument("--depth", metavar="NETWORK", help="instead of a batch: the deepest "
                   "network of symbols/ that fits: resnet (bottleneck, depth 3k+2; CIFAR "
                   "layout for --image <= 32) or lstm (the paper's 4x1024, by unroll length)")
    p.add_argument("--batch", type=int, default=32, help="batch for --depth")
    p.add_argument("--image", type=int, default=224, help="image side for --depth resnet")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per "
                                                       "policy")
    p = sub.add_parser("run", help="run SCRIPT.py [ARGS...] with every bind planned",
                       description="Run SCRIPT.py as `python SCRIPT.py ARGS...` would, with "
                                   "every Symbol.simple_bind/bind (and so Module, "
                                   "BucketingModule) planned by the policy.")
    _plan_options(p)
    p.add_argument("script", metavar="SCRIPT.py", help="the unchanged training script")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="the script's own arguments, passed on as they are"
                   ).required = False  # argparse marks REMAINDER required: not named as such
    p = sub.add_parser("demo", help="plan the paper's ResNet and LSTM, print the table")
    p.add_argument("--out", default="mxmirror-demo", metavar="FOLDER",
                   help="folder for the graph drawings and memory timelines")
    p.add_argument("--quick", action="store_true", help="small networks (seconds)")
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            build_parser().print_help()
            return EXIT_BAD_INPUT
        if args.command in ("run", "demo"):  # the script's own output; the demo's table
            code = COMMANDS[args.command](args)
        else:  # alive from the start: importing MXNet and reading the symbol count too
            with task(args.command):
                code = COMMANDS[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
        return code
    except PlanError as exc:
        print(f"mxmirror: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("mxmirror: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader left (`mxmirror plan ... | head -1`): stop quietly
        # Python would flush stdout again at exit and report the same error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _load(args):
    from mxmirror.api import parse_budget

    if not args.shape:
        raise PlanError("give at least one --shape NAME=D0,D1,... for the data input")
    shapes = _shapes(args.shape)
    budget = parse_budget(args.budget)
    return read_symbol(args.symbol), shapes, _dtype(args, shapes), budget


def cmd_plan(args) -> int:
    from mxmirror.api import plan
    from mxmirror.tools.share import memory_share

    sym, shapes, dtypes, budget = _load(args)
    ctx = load_mxnet().gpu(0) if args.gpu else None
    p = plan(sym, policy=args.policy, budget=budget, type_dict=dtypes, ctx=ctx, **shapes)
    if args.out:
        try:
            Path(args.out).write_text(symbol_json(p.symbol))
        except OSError as exc:
            raise PlanError(f"cannot write {args.out}: {exc.strerror}") from None
    if args.json:
        print(json.dumps(p.to_dict()))
    else:
        print(p.summary())
        print(f"checkpoints ({len(p.checkpoints)}): {', '.join(p.checkpoints[:20])}"
              + (" ..." if len(p.checkpoints) > 20 else ""))
        for note in p.notes:
            print(f"note: {note}")
        print("\n".join(memory_share(p)))
        if args.out:
            print(f"planned symbol written to {args.out}")
    return 0


def cmd_memory(args) -> int:
    from mxmirror.api import plan
    from mxmirror.sim import memory_plan, training_graph
    from mxmirror.tools.share import memory_share

    sym, shapes, dtypes, budget = _load(args)
    p = plan(sym, policy=args.policy, budget=budget, type_dict=dtypes, **shapes)
    base = training_graph.build(p.graph, set())
    sim = {s: memory_plan.simulate(base, s).mb for s in memory_plan.STRATEGIES}
    sim["planned"] = p.planned_mb
    out = {"policy": args.policy, "simulated_mb": {k: round(v, 3) for k, v in sim.items()}}
    if p.execution.kind == "mirror":  # the distance to the limit (planning/reference.py)
        from mxmirror.planning.reference import NO_CUT, live_peak_bytes, reference

        ref = reference(p.analysis)
        out["live_peak_mb"] = round(live_peak_bytes(p.analysis, p.recomputed_ids) / 2**20, 3)
        out["reference_mb"] = None if ref is None else round(ref.reference_bytes / 2**20, 3)
        if ref is None:
            out["reference_note"] = NO_CUT
    if not args.no_bind:
        sharing = mxnet_mb_many([{
            "symbol": p.source_json, "shapes": shapes, "type_dict": dtypes,
            "grad_req": p.inputs.grad_req}])[0]
        if p.execution.kind == "segmented":  # several executors on one pool: the whole
            whole = p.execution.measure(p)
            planned = whole["measured_mb"]["total"]
            out["segmented_mb"] = {k: whole[k] for k in ("measured_mb", "predicted_mb")}
        else:
            planned = p.mxnet_mb()
        out["mxnet_mb"] = {"sharing": sharing, "planned": planned}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{'strategy':<10} {'simulated MB':>13} {'MXNet MB':>9}")
    for k in ("none", "inplace", "sharing", "planned"):
        mx_mb = out.get("mxnet_mb", {}).get(k, "")
        print(f"{k:<10} {sim[k]:>13.1f} {'-' if mx_mb is None else mx_mb!s:>9}")
    if "live_peak_mb" in out:
        print(f"live peak of the plan under ideal allocation: {mb_text(out['live_peak_mb'], 1)}; "
              + (f"no reference: {out['reference_note']}" if out["reference_mb"] is None
                 else f"the best one-recompute plan's: {mb_text(out['reference_mb'], 1)}"))
    print("\n".join(memory_share(p)))
    return 0


def cmd_viz(args) -> int:
    from mxmirror.api import plan
    from mxmirror.tools.timeline import plot_timeline
    from mxmirror.tools.viz import check_collapse, check_outputs, plot_plan

    if not args.output and not args.timeline:
        raise PlanError("nothing to draw: give -o FILE.svg (the graph) and/or "
                        "--timeline FILE.png (memory over the training step)")
    check_outputs(args.output, args.timeline)
    collapse = check_collapse(args.collapse)
    sym, shapes, dtypes, budget = _load(args)
    p = plan(sym, policy=args.policy, budget=budget, type_dict=dtypes, **shapes)
    lines, written = [p.summary()], {}
    if args.timeline:
        written["timeline"] = str(plot_timeline(p, args.timeline))
        lines.append(f"wrote {written['timeline']}")
    if args.output:
        path, note = plot_plan(p, args.output, collapse=collapse)
        if path.suffix != Path(args.output).suffix:  # no Graphviz: only the DOT source
            print("\n".join(lines))
            raise PlanError(f"cannot draw {args.output}: {note}; dot -T"
                            f"{Path(args.output).suffix[1:]} {path} -o {args.output} draws it "
                            f"once Graphviz is installed")
        written["graph"] = str(path)
        lines.append(f"wrote {path}" + (f" ({note})" if note else ""))
        if note:
            written["note"] = note
    print(json.dumps(dict(p.to_dict(), written=written)) if args.json else "\n".join(lines))
    return 0


def _shape_template(text: str) -> tuple[str, tuple[int | str, ...]]:
    """NAME=N,3,224,224: integers, and N where the batch goes."""
    name, dims = _dims(text, "N,D1,...", "N,3,224,224")
    out: list[int | str] = []
    for d in dims:
        if d.upper() == "N":
            out.append("N")
        elif d.isdigit() and int(d) > 0:
            out.append(int(d))
        else:
            raise PlanError(f"--shape {text!r}: dimensions must be positive integers or N")
    return name, tuple(out)


def cmd_fit(args) -> int:
    from mxmirror.api import parse_budget
    from mxmirror.tools import fitting

    try:
        memory = parse_budget(args.memory)
    except PlanError:
        raise PlanError(f"--memory must be a size such as 12GB or 800MB, not "
                        f"{args.memory!r}") from None
    policies = (args.policy,) if args.policy else fitting.POLICIES
    fitting.check_policies(policies)
    if args.depth:
        if args.symbol or args.shape:
            raise PlanError("--depth searches a network of symbols/: give no SYMBOL or "
                            "--shape with it")
        if args.batch <= 0 or args.image <= 0:
            raise PlanError("--batch and --image must be positive")
        search = fitting.depth_search(args.depth, args.batch, args.image)
        what = f"{args.depth}, batch {args.batch}"
    else:
        if not args.symbol:
            raise PlanError("give a symbol JSON file, or --depth resnet|lstm")
        if not args.shape:
            raise PlanError("give --shape NAME=N,D1,... with the batch written as N")

        sym = load_symbol(args.symbol)
        shapes = _shapes(args.shape, _shape_template)
        search = fitting.batch_search(sym, shapes, _dtype(args, shapes))
        what = args.symbol
    rows = [(p, *search.largest(p, memory)) for p in policies]
    key = search.key
    if args.json:  # nothing fits: size 0, with the figures at the smallest size tried
        print(json.dumps([good.to_dict(key) if good else dict(bad.to_dict(key), **{key: 0})
                          for _, good, bad in rows]))
        return 0
    # whole MB rounded towards the verdict: what fits down, what does not fit up
    print(f"{what}: the largest {key} that fits {_mb(memory)} MB, counting "
          f"{fitting.COUNTED}")
    print(f"{'policy':<11} {key:>8} {'planned MB':>11} {'total MB':>9} {'recompute':>10}"
          f"  first {key} that does not fit")
    for policy, good, bad in rows:
        after = "-" if bad is None else (
            f"{bad.value} ({_mb(bad.total_bytes, up=True)} MB)" if bad.planned_bytes
            else f"{bad.value} (no plan within what the resident arrays leave)")
        if good is None:
            print(f"{policy:<11} {'none':>8} {'':>11} {'':>9} {'':>10}  {after}")
        else:
            print(f"{policy:<11} {good.value:>8} {_mb(good.planned_bytes):>11} "
                  f"{_mb(good.total_bytes):>9} {good.recompute_ratio:>9.2f}x  {after}")
    return 0


def _mb(nbytes: int, up: bool = False) -> int:
    """Whole MB, rounded down (or up): a total that does not fit never reads as the memory."""
    return -(-nbytes // 2**20) if up else nbytes // 2**20


def cmd_run(args) -> int:
    from mxmirror.frontends.hook import enable
    from mxmirror.planning.registry import resolve

    resolve(args.policy, args.budget)
    script = Path(args.script)
    if not script.is_file():
        raise PlanError(f"script not found: {script}")
    enable(args.policy, args.budget)
    sys.argv = [str(script), *args.args]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        _run_as_main(script)
    except BrokenPipeError:  # the reader left: main's quiet ending, as for every command
        raise
    except Exception as exc:  # as `python SCRIPT.py` shows it: the script's frames only
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_globals.get("__name__") in (__name__, "runpy"):
            tb = tb.tb_next
        sys.excepthook(type(exc), exc, exc.with_traceback(tb).__traceback__)
        return 1
    return 0


def _run_as_main(script: Path) -> None:
    """Run `script` as ``python SCRIPT.py`` runs it: module __main__, __file__ and its code
    named by the absolute path, sys.argv[0] as given (runpy.run_path gives either both
    relative or both absolute: a script reading a file beside itself did not find it)."""
    path = str(script.resolve())
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __loader__=None, __spec__=None,
                         __builtins__=builtins)
    with tokenize.open(path) as source:  # its encoding declaration read, as Python does
        code = compile(source.read(), path, "exec")
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main  # pickle finds the script's own classes there
    try:
        exec(code, main.__dict__)
    finally:
        sys.modules["__main__"] = saved


def cmd_demo(args) -> int:
    from mxmirror.frontends.demo import run_demo

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise PlanError(f"--out {out} is a file; demo writes several drawings into a folder: "
                        f"give a folder name (new or existing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlanError(f"cannot make the folder --out {out}: {exc.strerror}") from None
    return run_demo(out, quick=args.quick)


COMMANDS = {"plan": cmd_plan, "memory": cmd_memory, "viz": cmd_viz, "fit": cmd_fit,
            "run": cmd_run, "demo": cmd_demo}
