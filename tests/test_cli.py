"""The ``mxmirror`` command line: plan, memory, and the bad-input contract.

Bad input ends with exit code 2, a last stderr line starting
``mxmirror: error:`` and no Python traceback.  The table of bad inputs is
checked in-process (``cli.main`` with file-descriptor capture, so MXNet's own
C++ log lines are seen too) and a few rows again as real processes.
``python -m tests.test_cli`` (from the repository's root) regenerates docs/bad_input.md from
real runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from mxmirror.adapter.children import allocated_mb
from mxmirror.frontends import cli
from symbols.resnet import resnet_by_depth
from tests.helpers import child_env, cli_child

ROOT = Path(__file__).resolve().parents[1]
DESIGN_KEYS = {"policy", "nodes", "mirrored", "checkpoints", "baseline_mb", "planned_mb",
               "recompute_ratio", "plan_seconds"}


def _fc_net() -> mx.sym.Symbol:
    x = mx.sym.Variable("data")
    for i in range(3):
        x = mx.sym.FullyConnected(x, num_hidden=32, name=f"fc{i}")
        x = mx.sym.Activation(x, act_type="relu", name=f"relu{i}")
    x = mx.sym.FullyConnected(x, num_hidden=10, name="out")
    return mx.sym.SoftmaxOutput(x, name="softmax")


def make_files(folder: Path) -> dict[str, Path]:
    """The symbol files (good and bad) the CLI tests and the doc generator use."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"resnet": folder / "resnet8-symbol.json", "fc": folder / "fc-symbol.json",
             "truncated": folder / "truncated.json", "notsym": folder / "notsym.json",
             "binary": folder / "binary.json", "dir": folder / "adir.json",
             "missing": folder / "missing.json", "params": folder / "resnet8-0000.params"}
    resnet_by_depth(8, bottleneck=False, num_classes=10, image_shape=(3, 32, 32)).save(
        str(files["resnet"]))
    _fc_net().save(str(files["fc"]))
    text = files["resnet"].read_text()
    files["truncated"].write_text(text[: len(text) // 2])
    files["notsym"].write_text(json.dumps({"name": "model", "layers": [1, 2, 3]}))
    files["binary"].write_bytes(b"\xff\xfe\x00\x01garbage\x80\x81")
    files["dir"].mkdir(exist_ok=True)
    mx.nd.save(str(files["params"]), {"arg:fc1_weight": mx.nd.zeros((10, 64))})
    return files


# (id, what is wrong, argv with {placeholders} for files)
BAD_INPUTS = [
    ("missing_file", "symbol file does not exist",
     "plan {missing} --shape data=4,3,32,32"),
    ("truncated_json", "truncated JSON file",
     "plan {truncated} --shape data=4,3,32,32"),
    ("binary_file", "binary (non-UTF-8) file",
     "plan {binary} --shape data=4,3,32,32"),
    ("directory", "a directory instead of a file",
     "plan {dir} --shape data=4,3,32,32"),
    ("not_a_symbol", "valid JSON that is not a symbol",
     "plan {notsym} --shape data=4,3,32,32"),
    ("params_file", "a .params file (saved weights) given as the symbol",
     "plan {params} --shape data=4,3,32,32"),
    ("no_shape", "no --shape", "plan {resnet}"),
    ("malformed_shape", "malformed --shape", "plan {resnet} --shape data=3,x"),
    ("non_integer_shape", "non-integer dimension", "plan {resnet} --shape data=3,abc"),
    ("shape_without_name", "--shape without NAME=", "plan {resnet} --shape 4,3,32,32"),
    ("shape_empty_name", "--shape with an empty NAME", "plan {resnet} --shape =4,3,32,32"),
    ("shape_twice", "--shape for the same input twice",
     "plan {resnet} --shape data=4,3,32,32 --shape data=8,3,32,32"),
    ("shape_empty_dim", "empty dimension", "plan {resnet} --shape data=4,,3,32,32"),
    ("shape_trailing_comma", "trailing comma", "plan {resnet} --shape data=4,3,32,32,"),
    ("unknown_input", "shape for an input the symbol does not have",
     "plan {resnet} --shape image=4,3,32,32"),
    ("negative_dim", "negative dimension", "plan {resnet} --shape data=-4,3,32,32"),
    ("zero_dim", "zero dimension", "plan {resnet} --shape data=0,3,32,32"),
    ("unknown_dtype", "unknown dtype",
     "plan {resnet} --shape data=4,3,32,32 --dtype float17"),
    ("dtype_twice", "--dtype for the same input twice",
     "plan {resnet} --shape data=4,3,32,32 --dtype float16 --dtype data=float32"),
    ("dtype_empty_name", "--dtype with an empty NAME",
     "plan {resnet} --shape data=4,3,32,32 --dtype =float16"),
    ("unknown_policy", "unknown policy",
     "plan {resnet} --shape data=4,3,32,32 --policy fastest"),
    ("impossible_budget", "budget below anything reachable",
     "plan {resnet} --shape data=4,3,32,32 --policy budget --budget 1KB"),
    ("budget_missing", "budget policy without --budget",
     "plan {resnet} --shape data=4,3,32,32 --policy budget"),
    ("malformed_budget", "malformed --budget",
     "plan {resnet} --shape data=4,3,32,32 --policy budget --budget lots"),
    ("negative_budget", "negative --budget",
     "plan {resnet} --shape data=4,3,32,32 --policy budget --budget=-5MB"),
    ("zero_budget", "zero --budget",
     "plan {resnet} --shape data=4,3,32,32 --policy budget --budget 0"),
    ("budget_below_a_byte", "--budget below one byte",
     "plan {resnet} --shape data=4,3,32,32 --policy budget --budget 0.5B"),
    ("inference_impossible", "only the label shape given: data shape cannot be inferred",
     "plan {fc} --shape softmax_label=4"),
    ("wrong_rank", "data shape of the wrong rank for the network",
     "plan {resnet} --shape data=4,3"),
    ("out_unwritable", "--out into a folder that does not exist",
     "plan {resnet} --shape data=4,3,32,32 --out {dir}/no/such/dir/out.json"),
    ("memory_unknown_policy", "memory: unknown policy",
     "memory {resnet} --shape data=4,3,32,32 --policy fastest --no-bind"),
    ("memory_missing_file", "memory: symbol file does not exist",
     "memory {missing} --shape data=4,3,32,32 --no-bind"),
    ("viz_no_shape", "viz: no --shape", "viz {resnet} -o {dir}/plan.dot"),
    ("fit_no_n", "fit: no batch dimension written N",
     "fit {resnet} --shape data=4,3,32,32 --memory 1GB"),
    ("fit_bad_dim", "fit: a dimension that is neither an integer nor N",
     "fit {resnet} --shape data=N,x,32,32 --memory 1GB"),
    ("fit_empty_dim", "fit: empty dimension",
     "fit {resnet} --shape data=N,3,32,32, --memory 1GB"),
    ("fit_shape_twice", "fit: --shape for the same input twice",
     "fit {resnet} --shape data=N,3,32,32 --shape data=N,3,16,16 --memory 1GB"),
    ("fit_no_memory", "fit: no --memory", "fit {resnet} --shape data=N,3,32,32"),
    ("fit_bad_memory", "fit: malformed --memory",
     "fit {resnet} --shape data=N,3,32,32 --memory lots"),
    ("fit_unknown_network", "fit: --depth of a network symbols/ does not have",
     "fit --depth vgg --memory 1GB"),
    ("fit_depth_and_symbol", "fit: --depth with a symbol file",
     "fit {resnet} --depth resnet --memory 1GB"),
    ("run_missing_script", "run: script does not exist", "run --policy sqrt {missing}"),
    ("run_no_script", "run: no script", "run --policy sqrt"),
    ("run_unknown_policy", "run: unknown policy", "run --policy fastest {resnet}"),
    ("budget_not_taken", "--budget with a policy that plans without one",
     "plan {resnet} --shape data=4,3,32,32 --policy sqrt --budget 800MB"),
    ("multilevel_budget_missing", "multilevel without --budget",
     "plan {resnet} --shape data=4,3,32,32 --policy multilevel"),
    ("run_budget_missing", "run: budget policy without --budget", "run --policy budget {resnet}"),
    ("run_budget_not_taken", "run: --budget with a policy that plans without one",
     "run --policy optimal --budget 1GB {resnet}"),
    ("demo_out_is_file", "demo: --out names an existing file", "demo --quick --out {resnet}"),
    ("unknown_command", "unknown subcommand", "frobnicate {resnet}"),
    ("unknown_option", "unknown option", "plan {resnet} --shape data=4,3,32,32 --fast"),
]


def _argv(template: str, files: dict[str, Path]) -> list[str]:
    return template.format(**{k: str(v) for k, v in files.items()}).split()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    return make_files(tmp_path_factory.mktemp("cli"))


def _cli(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mxmirror", *args], capture_output=True,
                          text=True, env=child_env(), cwd=cwd, timeout=300)


def _check_bad(code: int, err: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert lines and lines[-1].startswith("mxmirror: error:"), err
    assert "Traceback" not in err, err


# ------------------------------------------------------------------ plan
def test_plan_json_keys(files) -> None:
    proc = _cli(["plan", str(files["resnet"]), "--shape", "data=4,3,32,32", "--policy",
                 "sqrt", "--json"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) == DESIGN_KEYS
    assert out["policy"] == "sqrt"
    assert out["nodes"] > 0 and out["mirrored"] and out["checkpoints"]
    assert 0 < out["planned_mb"] < out["baseline_mb"]
    assert out["recompute_ratio"] > 0 and out["plan_seconds"] >= 0


def test_a_kept_plan_is_printed_without_importing_mxnet(files, tmp_path) -> None:
    """`plan` of a symbol file planned before (the same text, inputs and policy) prints the
    same lines without importing MXNet: what MXNet read from the file and the plan are kept.
    The same file name with another symbol in it is read and planned afresh."""
    code = ("import sys; from mxmirror.frontends.cli import main; code = main(sys.argv[1:]); "
            "print('mxnet imported:', 'mxnet' in sys.modules); sys.exit(code)")
    symbol = tmp_path / "net-symbol.json"

    def plan(shape: str) -> list[str]:
        proc = subprocess.run([sys.executable, "-c", code, "plan", str(symbol), "--shape",
                               shape, "--policy", "sqrt"], capture_output=True, text=True,
                              timeout=300, env=child_env(MXMIRROR_CACHE=str(tmp_path / "c")))
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()

    symbol.write_text(files["resnet"].read_text())
    first = plan("data=4,3,32,32")
    assert first[-1] == "mxnet imported: True"
    assert plan("data=4,3,32,32") == first[:-1] + ["mxnet imported: False"]
    symbol.write_text(files["fc"].read_text())
    other = plan("data=4,3,32,32")
    assert other[-1] == "mxnet imported: True" and other[0] != first[0]
    assert plan("data=4,3,32,32") == other[:-1] + ["mxnet imported: False"]


def test_plan_out_binds_in_plain_mxnet(files, tmp_path) -> None:
    out = tmp_path / "planned-symbol.json"
    proc = _cli(["plan", str(files["resnet"]), "--shape", "data=4,3,32,32", "--out",
                 str(out)])
    assert proc.returncode == 0, proc.stderr
    assert f"planned symbol written to {out}" in proc.stdout
    nodes = json.loads(out.read_text())["nodes"]
    assert any((n.get("attrs") or {}).get("__force_mirroring__") == "True" for n in nodes)
    # A child without mxmirror: -I ignores PYTHONPATH and the user site, -S skips
    # site-packages' .pth files (mxmirror's editable install is one), and
    # site-packages itself is appended by hand so mxnet imports.
    site = sysconfig.get_paths()["purelib"]
    code = f"""
import sys
sys.path.append({site!r})
try:
    import mxmirror
except ImportError:
    print("no mxmirror")
else:
    raise SystemExit("mxmirror importable: " + mxmirror.__file__)
import mxnet as mx
sym = mx.sym.load({str(out)!r})
ex = sym.simple_bind(mx.cpu(), data=(4, 3, 32, 32), softmax_label=(4,))
ex.forward(is_train=True)
ex.backward()
print("mirror", "_mirror" in ex.debug_str(), ex.outputs[0].shape)
"""
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300,
                          env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "no mxmirror" in proc.stdout
    assert "mirror True (4, 10)" in proc.stdout


def test_plan_text_output(files, capfd) -> None:
    rc = cli.main(["plan", str(files["resnet"]), "--shape", "data=4,3,32,32", "--policy",
                   "cheap"])
    out = capfd.readouterr().out
    assert rc == 0
    assert out.startswith("mxmirror: policy=cheap")
    assert "checkpoints" in out


@pytest.mark.parametrize(("command", "batch", "small"), [
    ("plan", 4, False), ("memory", 64, False), ("plan", 1, True)])
def test_plan_and_memory_say_when_a_plan_pays(files, capfd, command, batch, small) -> None:
    """The intermediates' share of training memory (arguments, gradients and aux states
    are the rest: resident_bytes) and what the plan saves of it; under 10% says so (the FC
    net at batch 1: its weights outweigh its activations)."""
    from mxmirror.api import plan
    from mxmirror.ir.graph import resident_bytes

    sym = files["fc" if small else "resnet"]
    shape = f"data={batch},32" if small else f"data={batch},3,32,32"
    extra = ["--no-bind"] if command == "memory" else []
    assert cli.main([command, str(sym), "--shape", shape, *extra]) == 0
    out = capfd.readouterr().out
    p = plan(str(sym), data=tuple(int(d) for d in shape[5:].split(",")))
    total = p.baseline_bytes + sum(resident_bytes(p.graph))
    share = re.search(r"of which intermediates \(activations and their gradients, what a plan "
                      r"can shrink\) .* = (\d+)%; arguments ", out)
    assert share and int(share.group(1)) == round(100 * p.baseline_bytes / total), out
    saves = re.search(r"this plan saves .* = (\d+)% of it(: under 10%)?", out)
    assert saves and int(saves.group(1)) == round(
        100 * (p.baseline_bytes - p.planned_bytes) / total), out
    assert bool(saves.group(2)) == small, out


@pytest.mark.parametrize("command", ["plan", "memory"])
def test_huge_sizes_read_in_gb_and_tb(files, capfd, command) -> None:
    """Above 10240 MB the text says GB, above 10240 GB TB (55.1 GB, not 56458 MB); the JSON
    figures stay in MB."""
    argv = [command, str(files["fc"]), "--shape", "data=100000000,32",
            *(["--no-bind"] if command == "memory" else [])]
    assert cli.main(argv) == 0
    text = capfd.readouterr().out
    table = r"^(none|inplace|sharing|planned) "  # memory's table: a column of MB
    lines = [ln for ln in text.splitlines() if not re.match(table, ln)]
    assert not [n for n in re.findall(r"(\d+)(?:\.\d)? MB", "\n".join(lines))
                if int(n) > 10240], text
    if command == "plan":  # the summary line
        assert "baseline=55.1 GB planned=55.1 GB" in text, text
    assert "training memory without a plan: 67.8 GB" in text, text
    assert cli.main([*argv, "--json"]) == 0
    out = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    mb = out["baseline_mb"] if command == "plan" else out["simulated_mb"]["sharing"]
    assert round(mb) == 56458, out


@pytest.mark.parametrize(("mb", "digits", "text"), [
    (0.05, None, "51.2 KB"), (5.55, None, "5.5 MB"), (4567.8, None, "4568 MB"),
    (4567.8, 0, "4568 MB"), (4567.8, 1, "4567.8 MB"), (10240, None, "10240 MB"),
    (10241, 0, "10.0 GB"), (46001, None, "44.9 GB"), (10240 * 1024, 1, "10240 GB"),
    (10240 * 1024 + 1, None, "10.0 TB"), (118171692, 0, "113 TB")])
def test_size_text_units(mb, digits, text) -> None:
    from mxmirror.log import mb_text

    assert mb_text(mb, digits) == text


def test_plan_float16(files, tmp_path, capfd) -> None:
    """The float16 plan is a real plan whose planned symbol binds with float16 data and whose
    simulated figure is MXNet's for that bind."""
    out_file = tmp_path / "planned16.json"
    rc = cli.main(["plan", str(files["resnet"]), "--shape", "data=32,3,32,32", "--dtype",
                   "float16", "--json", "--out", str(out_file)])
    assert rc == 0
    out = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert out["mirrored"] and 0 < out["planned_mb"] < out["baseline_mb"]
    sym = mx.sym.load(str(out_file))
    req = {a: ("null" if a in ("data", "softmax_label") else "write")
           for a in sym.list_arguments()}
    ex = sym.simple_bind(mx.cpu(), grad_req=req, type_dict={"data": "float16"},
                         data=(32, 3, 32, 32))
    assert ex.arg_dict["data"].dtype == np.float16
    mxnet_mb = allocated_mb(ex)[0]
    assert mxnet_mb >= 10, "pick shapes with figures that mean something"
    assert 0 <= out["planned_mb"] - mxnet_mb <= 1.0, (out, mxnet_mb)


# ------------------------------------------------------------------ memory
def test_memory_json_matches_mxnet(files) -> None:
    proc = _cli(["memory", str(files["resnet"]), "--shape", "data=64,3,32,32", "--json"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out["simulated_mb"]) == {"none", "inplace", "sharing", "planned"}
    assert set(out["mxnet_mb"]) == {"sharing", "planned"}
    sim, real = out["simulated_mb"], out["mxnet_mb"]
    assert real["sharing"] >= 50, "pick shapes with figures of at least ~50 MB"
    # MXNet prints floor(MB); the simulated figures are rounded to 3 decimals in the JSON
    assert 0 <= sim["sharing"] - real["sharing"] <= 1.0, out
    assert 0 <= sim["planned"] - real["planned"] <= 1.0, out
    assert sim["none"] >= sim["inplace"] >= sim["sharing"] > sim["planned"]
    assert real["planned"] < real["sharing"]


def test_memory_no_bind(files, capfd) -> None:
    rc = cli.main(["memory", str(files["resnet"]), "--shape", "data=4,3,32,32", "--json",
                   "--no-bind"])
    out = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert rc == 0
    assert "mxnet_mb" not in out and set(out["simulated_mb"]) >= {"sharing", "planned"}


# ------------------------------------------------------------------ run
FAILING_SCRIPTS = {  # file name: text; each fails (or exits) as `python FILE` would
    "raises.py": "def f():\n    raise ValueError('boom')\n\nf()\n",
    "chained.py": "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise KeyError(1) from e\n",
    "syntax.py": "x = (\n",
    "notes.txt": "hello world, not Python\n",
    "exits.py": "import sys\nsys.exit(3)\n",
    "exits_text.py": "import sys\nsys.exit('bye')\n",
}


@pytest.mark.parametrize("name", list(FAILING_SCRIPTS))
def test_run_a_failing_script_as_python_does(name, tmp_path) -> None:
    """A script that raises (or does not compile, or exits) shows what `python SCRIPT.py`
    shows, with the same exit code: the script's own frames, none of mxmirror's or runpy's."""
    script = tmp_path / name
    script.write_text(FAILING_SCRIPTS[name])
    proc = _cli(["run", "--policy", "sqrt", str(script)], cwd=tmp_path)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=child_env(), cwd=tmp_path, timeout=300)
    assert (proc.returncode, proc.stderr) == (plain.returncode, plain.stderr), proc.stderr
    assert proc.returncode == (3 if name == "exits.py" else 1)
    assert "cli.py" not in proc.stderr and "runpy" not in proc.stderr, proc.stderr
    if not name.startswith("exits"):
        assert f'File "{script}", line ' in proc.stderr, proc.stderr


def test_run_gives_the_script_what_python_gives(tmp_path) -> None:
    """A script named relative to the working directory sees the __file__ (absolute),
    argv and sys.path[0] that `python SCRIPT.py` gives it: a script reading a file beside
    itself finds it."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "where.py").write_text(
        "import os, sys\nprint(__file__, sys.argv, sys.path[0])\n"
        "open(os.path.join(os.path.dirname(__file__), 'config.json')).read()\n")
    proc = _cli(["run", "--policy", "sqrt", "where.py", "--flag"], cwd=tmp_path)
    plain = subprocess.run([sys.executable, "where.py", "--flag"], capture_output=True,
                           text=True, env=child_env(), cwd=tmp_path, timeout=300)
    assert proc.returncode == plain.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout, (proc.stdout, plain.stdout)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(("case", "what", "template"), BAD_INPUTS,
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_input(case, what, template, files, capfd) -> None:
    try:
        code = cli.main(_argv(template, files))
    except SystemExit as exc:  # must not happen: main returns the code
        pytest.fail(f"{case}: SystemExit({exc.code}) instead of a return code")
    _check_bad(code, capfd.readouterr().err)


@pytest.mark.parametrize("case", ["non_integer_shape", "inference_impossible"])
def test_bad_input_real_process(case, files) -> None:
    template = next(t for c, _, t in BAD_INPUTS if c == case)
    proc = _cli(_argv(template, files))
    _check_bad(proc.returncode, proc.stderr)


@pytest.mark.parametrize(("argv", "message"), [
    ("plan {resnet} --shape data=4,3,32,32 --policy sqrt --budget 800MB",
     "policy 'sqrt' takes no budget; only budget, multilevel and auto plan to a budget"),
    ("plan {resnet} --shape data=4,3,32,32 --policy multilevel", "needs a budget"),
    ("plan {resnet} --shape data=4,3,32,32 --policy budget --budget 0.5B",
     "budget '0.5B' is below one byte: too small"),
    ("run --policy budget {resnet}", "needs a budget"),
    ("demo --quick --out {resnet}", "is a file; demo writes several drawings into a folder"),
    ("plan {resnet} --shape image=4,3,32,32",
     "no input 'image'; its inputs without a gradient (data, labels, states) are data, "
     "softmax_label; besides them it has 29 parameters and 18 auxiliary states"),
    ("plan {resnet} --shape =4,3,32,32",
     "--shape takes NAME=D0,D1,..., e.g. data=32,3,224,224; got '=4,3,32,32'"),
    ("plan {resnet} --shape data=4,3,32,32 --shape data=8,3,32,32",
     "--shape for input 'data' given twice ('data=4,3,32,32', then 'data=8,3,32,32')"),
    ("plan {resnet} --shape data=4,,3,32,32", "'data=4,,3,32,32': dimension 2 is empty"),
    ("plan {resnet} --shape data=4,3,32,32,", "'data=4,3,32,32,': dimension 5 is empty"),
    ("fit {resnet} --shape data=N,3,32,32, --memory 1GB",
     "'data=N,3,32,32,': dimension 5 is empty"),
    ("plan {resnet} --shape data=4,3,32,32 --dtype float16 --dtype data=float32",
     "--dtype for input 'data' given twice ('float16', then 'data=float32')"),
    ("plan {resnet} --shape data=4,3,32,32 --dtype =float16",
     "--dtype takes [NAME=]DTYPE, e.g. float16 or data=float16; got '=float16'"),
    ("plan {resnet} --shape data=4,3,32,32 --dtype image=float16",
     "its inputs without a gradient (data, labels, states) are data, softmax_label;"),
    ("plan {params} --shape data=4,3,32,32",
     "resnet8-0000.params is an MXNet parameter file (arrays saved by save_checkpoint, "
     "save_parameters or nd.save), not a symbol: give the symbol JSON saved beside it"),
])
def test_bad_input_message(argv, message, files, capfd) -> None:
    assert cli.main(_argv(argv, files)) == cli.EXIT_BAD_INPUT
    assert message in capfd.readouterr().err.strip().splitlines()[-1]


def test_fit_dtype_for_every_shaped_input(files, capfd) -> None:
    """fit's --shape has N for the batch; --dtype without NAME still reads those names."""
    argv = ["fit", str(files["fc"]), "--shape", "data=N,32", "--memory", "64MB", "--policy",
            "sqrt", "--json"]
    assert cli.main(argv) == 0
    float32 = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert cli.main([*argv, "--dtype", "float16"]) == 0
    float16 = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert float16 != float32, float16


def test_run_without_a_script_names_only_the_script(capfd) -> None:
    """ARGS may be left out: the error asks for SCRIPT.py alone."""
    assert cli.main(["run", "--policy", "sqrt"]) == cli.EXIT_BAD_INPUT
    assert capfd.readouterr().err.strip().splitlines()[-1] == (
        "mxmirror: error: the following arguments are required: SCRIPT.py")


@pytest.mark.parametrize("policy", ["none", "cheap", "sqrt", "search", "optimal", "recursive"])
def test_budget_refused_where_not_taken(policy, files, capfd) -> None:
    from mxmirror.planning.registry import NEEDS_BUDGET, POLICIES

    assert policy in POLICIES and policy not in NEEDS_BUDGET
    argv = ["plan", str(files["fc"]), "--shape", "data=4,32", "--policy", policy,
            "--budget", "1GB"]
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    assert f"policy {policy!r} takes no budget" in capfd.readouterr().err


def test_plan_into_a_closed_pipe(files) -> None:
    """`mxmirror plan ... | head -1`: a reader that leaves early ends the command quietly."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written: EPIPE for certain
    try:
        proc = subprocess.run([sys.executable, "-m", "mxmirror", "plan", str(files["resnet"]),
                               "--shape", "data=4,3,32,32"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, env=child_env(), timeout=300)
    finally:
        os.close(write_end)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == cli.EXIT_BROKEN_PIPE


def test_a_command_is_alive_from_its_start(files, tmp_path) -> None:
    """With stderr a pipe, the command's own task is the outermost one from the first line:
    importing MXNet and reading the symbol, before any planning, count towards the 10 s."""
    proc = subprocess.run([*cli_child(0.05), "plan", str(files["resnet"]),
                           "--shape", "data=4,3,32,32", "--policy", "search"],
                          capture_output=True, text=True, timeout=300,
                          env=child_env(MXMIRROR_CACHE=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("mxmirror: plan: ")]
    assert lines and proc.stderr.startswith("mxmirror: plan: "), proc.stderr[:500]
    assert lines[-1].startswith("mxmirror: plan: done, "), lines[-3:]


def test_ctrl_c_says_interrupted(tmp_path) -> None:
    """SIGINT once the work is under way (its first progress line): one line
    `mxmirror: interrupted`, exit code 130, no traceback."""
    # SIGINT as a terminal gives it: a suite started in the background (nohup, `&`) ignores
    # SIGINT, and its children inherit that (Python then installs no KeyboardInterrupt)
    proc = subprocess.Popen([*cli_child(0.2), "fit", "--depth", "lstm", "--batch",
                             "64", "--memory", "1TB", "--policy", "search"],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=child_env(MXMIRROR_CACHE=str(tmp_path)),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = proc.stderr.readline()  # a progress line: planning has begun
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert first.startswith("mxmirror: "), first + err
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "mxmirror: interrupted", err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal width


def test_help_shows_choices_and_defaults(capsys) -> None:
    from mxmirror.planning.registry import POLICIES

    choices = "{" + ",".join(POLICIES) + "}"  # the registry's names, in its order
    for command in ("plan", "memory", "viz", "run"):
        text = _help(command, capsys)
        assert f"--policy {choices}" in text, command
        assert "(default: sqrt)" in text and "--budget SIZE" in text, command
    run_help = _help("run", capsys)
    assert "SCRIPT.py" in run_help and "ARGS" in run_help
    assert "(default: mxmirror-demo)" in _help("demo", capsys)


# ------------------------------------------------------------------ docs/bad_input.md
NOTES = """
Notes:

- `x` is accepted as a dimension separator (`--shape data=4x3x32x32`), so
  `data=3,x` has an empty dimension between its `,` and its `x`.
- A budget starting with `-` must be written `--budget=-5MB`; `--budget -5MB`
  is an argparse error ("expected one argument"), also exit code 2.
"""


def write_doc(path: Path) -> None:
    """Run every bad input as a real process and write the markdown table."""
    import tempfile

    sys.path.insert(0, str(ROOT / "scripts"))
    from provenance import generated_by

    folder = Path(tempfile.mkdtemp(prefix="mxmirror-bad-"))
    files = make_files(folder)
    rows = []
    for _case, what, template in BAD_INPUTS:
        args = _argv(template, files)
        proc = _cli(args, cwd=folder)
        last = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:] or ["(nothing)"]
        shown = " ".join(["mxmirror", *args]).replace(str(folder) + "/", "")
        message = last[0].replace(str(folder) + "/", "").replace("|", "\\|")
        rows.append(f"| {what} | `{shown}` | {proc.returncode} | `{message}` |")
    path.write_text(
        "# Bad input\n\n"
        f"{generated_by('-m', ['tests.test_cli'])} Every row was produced by a real run;\n"
        "`python -m tests.test_bad_input` then writes the Python API section. Each ends\n"
        "with exit code 2, a last stderr line starting with `mxmirror: error:` and no\n"
        "Python traceback; `tests/test_cli.py` checks it.\n"
        "Files: `resnet8-symbol.json` is a CIFAR ResNet-8 (input `data`, label\n"
        "`softmax_label`), `fc-symbol.json` a 4-layer FullyConnected net.\n\n"
        "| input | command | exit | what mxmirror prints (last stderr line) |\n"
        "|---|---|---|---|\n" + "\n".join(rows) + "\n" + NOTES)


if __name__ == "__main__":
    write_doc(ROOT / "docs" / "bad_input.md")
