"""`mxmirror fit`: the largest batch (or depth) whose planned intermediates + arguments +
argument gradients + aux states fit a memory size, found on the simulator."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mxmirror.adapter.symbol import load_symbol
from mxmirror.frontends.cli import main
from mxmirror.tools import fitting
from symbols.resnet import resnet_by_depth

MEMORY = 48 * 2**20


@pytest.fixture(scope="module")
def symbol_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fit") / "resnet20.json"
    resnet_by_depth(20, bottleneck=False, num_classes=10, image_shape=(3, 32, 32)).save(str(path))
    return path


@pytest.fixture(scope="module")
def search(symbol_file):

    return fitting.batch_search(load_symbol(str(symbol_file)),
                                {"data": ("N", 3, 32, 32)})


@pytest.mark.parametrize("policy", ["none", "sqrt", "multilevel"])
def test_the_batch_found_fits_and_the_next_does_not(search, policy: str) -> None:
    good, bad = search.largest(policy, MEMORY)
    assert good.fits and good.total_bytes <= MEMORY and not bad.fits
    assert bad.size == good.size + 1
    if policy != "multilevel":  # a budgeted policy that cannot plan reports no figures
        assert bad.total_bytes > MEMORY
    resident = good.total_bytes - good.planned_bytes
    assert resident > 0  # arguments, gradients and aux states are counted


@pytest.mark.parametrize("policy", ["none", "sqrt", "multilevel"])
def test_probing_finds_what_a_scan_finds_in_few_plans(search, policy: str) -> None:
    """The line-guided probes end where a scan of every batch ends, planning few sizes
    (multilevel: guided by the least it reaches, after recursive's own probes)."""
    planned = []
    at = search.at

    def counting(p, k, memory):
        planned.append((p, k))
        return at(p, k, memory)

    search.at = counting
    try:
        good, bad = search.largest(policy, MEMORY)
    finally:
        del search.at
    scan = 1
    while search.at(policy, scan + 1, MEMORY).fits:
        scan += 1
    assert good.size == scan and bad.size == scan + 1
    own = [k for p, k in planned if p == policy]  # multilevel: recursive's probes aside
    assert len(own) <= 4 if policy == "multilevel" else len(own) <= 6
    assert 6 < scan  # doubling and bisection alone: about 2 log2(scan)


def test_recomputing_fits_a_larger_batch(search) -> None:
    none = search.largest("none", MEMORY)[0].size
    assert search.largest("cheap", MEMORY)[0].size >= none
    assert search.largest("sqrt", MEMORY)[0].size > none


def test_mxnet_agrees_at_the_batch_found(search) -> None:
    """MXNet's own plan + the arrays simple_bind allocates, at the batch found with no plan:
    the same total as the simulator (MXNet prints whole MB, rounded down)."""
    import subprocess
    import sys
    import textwrap

    good, _ = search.largest("none", MEMORY)
    req = search.prepared(good.size).inputs.grad_req  # as Module binds: no data gradient
    code = textwrap.dedent(f"""
        import re, mxnet as mx
        from symbols.resnet import resnet_by_depth
        sym = resnet_by_depth(20, bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
        ex = sym.simple_bind(mx.cpu(), grad_req={req!r}, data=({good.size}, 3, 32, 32))
        arrays = ex.arg_arrays + [g for g in ex.grad_arrays if g is not None] + ex.aux_arrays
        planned = int(re.search(r"Total (\\d+) MB", ex.debug_str()).group(1))
        print(planned, sum(a.size * 4 for a in arrays))
    """)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=root, check=True).stdout.split()
    planned_mb, resident = int(out[0]), int(out[1])
    assert resident == good.total_bytes - good.planned_bytes
    assert planned_mb == good.planned_bytes // 2**20


def test_cli_json_one_object_per_policy(symbol_file, capsys) -> None:
    assert main(["fit", str(symbol_file), "--shape", "data=N,3,32,32", "--memory", "48MB",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == list(fitting.POLICIES)
    for r in rows:
        assert set(r) == {"policy", "batch", "planned_mb", "total_mb", "recompute_ratio"}
        assert r["batch"] > 0 and r["total_mb"] <= 48


def test_cli_text_says_what_is_counted(symbol_file, capsys) -> None:
    assert main(["fit", str(symbol_file), "--shape", "data=N,3,32,32", "--memory", "48MB",
                 "--policy", "sqrt"]) == 0
    out = capsys.readouterr().out
    assert fitting.COUNTED in out and "sqrt" in out


def test_printed_figures_agree_with_the_verdict(search, symbol_file, capsys) -> None:
    """A memory one byte below the first total that does not fit: at the whole MB printed,
    that total reads above the memory, and the one that fits at most the memory."""
    _, bad = search.largest("none", MEMORY)
    memory = bad.total_bytes - 1
    assert main(["fit", str(symbol_file), "--shape", "data=N,3,32,32", "--memory",
                 str(memory), "--policy", "none"]) == 0
    head, _, row = capsys.readouterr().out.strip().splitlines()
    shown = int(re.search(r"fits (\d+) MB", head).group(1))
    cells = row.split()
    assert cells[0] == "none" and int(cells[1]) == bad.value - 1
    assert int(cells[3]) <= shown < int(re.search(r"\((\d+) MB\)", row).group(1)), row


def test_help_texts_have_choices_and_one_default() -> None:
    """Every option of every command has a help text, says its default once at most, and
    every --policy lists its choices."""
    from mxmirror.frontends import cli

    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.choices and "fit" in a.choices).choices
    for name, sub in commands.items():
        formatter = sub._get_formatter()
        for action in sub._actions:
            if action.dest == "help":
                continue
            text = formatter._get_help_string(action) % {**vars(action), "default":
                                                          action.default}
            assert action.help and text.count("default") <= 1, (name, action.dest, text)
            if action.dest == "policy":
                assert action.choices, name


def test_depth_search_finds_the_deepest_cifar_resnet(capsys) -> None:
    assert main(["fit", "--depth", "resnet", "--image", "32", "--batch", "4", "--memory",
                 "40MB", "--policy", "sqrt", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["depth"] > 11 and (row["depth"] - 2) % 9 == 0 and row["total_mb"] <= 40
    deeper = fitting.depth_search("resnet", 4, 32).at("sqrt", (row["depth"] - 2) // 9 + 1,
                                                       40 * 2**20)
    assert not deeper.fits


@pytest.mark.parametrize(("argv", "message"), [
    (["--shape", "data=32,3,32,32", "--memory", "1GB"], "write the batch dimension as N"),
    (["--shape", "data=N,x,32", "--memory", "1GB"], "positive integers or N"),
    (["--shape", "data=N,3,32,32", "--memory", "lots"], "--memory must be a size"),
    (["--shape", "data=N,3,32,32", "--memory", "1GB", "--policy", "bogus"],
     "invalid choice: 'bogus'"),
])
def test_bad_input_exits_2(symbol_file, capsys, argv, message) -> None:
    assert main(["fit", str(symbol_file), *argv]) == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(("argv", "message"), [
    (["--memory", "1GB"], "give a symbol JSON file"),
    (["--depth", "vgg", "--memory", "1GB"], "unknown network"),
    (["--depth", "resnet", "--batch", "0", "--memory", "1GB"], "must be positive"),
])
def test_bad_depth_input_exits_2(capsys, argv, message) -> None:
    assert main(["fit", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("mxmirror: error:") and message in err
