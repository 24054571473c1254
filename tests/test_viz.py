"""Drawing plans: DOT content, collapsing, rendering, the memory timeline, the viz command.

Small graphs only (a few seconds in all). The DOT text is parsed back with a
small reader of our own (one statement per line, as ``viz.to_dot`` writes it)
so that node classes, styles and labels are checked, not just substrings.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import pytest

from mxmirror.api import prepare
from mxmirror.errors import PlanError
from mxmirror.frontends import cli
from mxmirror.tools import timeline, viz
from tests.helpers import child_env

HAS_DOT = shutil.which("dot") is not None
_NODE = re.compile(r'^\s*(g\d+) \[(.*)\];$')
_EDGE = re.compile(r'^\s*(g\d+) -> (g\d+)(?: \[(.*)\])?;$')
_ATTR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_dot(text: str) -> tuple[dict[str, dict[str, str]], list[tuple[str, str]]]:
    """Graph nodes (g*) with their attributes, and the edges between them."""
    nodes, edges = {}, []
    for line in text.splitlines():
        m = _NODE.match(line)
        if m:
            nodes[m.group(1)] = dict(_ATTR.findall(m.group(2)))
            continue
        m = _EDGE.match(line)
        if m:
            edges.append((m.group(1), m.group(2)))
    return nodes, edges


def _resnet_like(units: int) -> mx.sym.Symbol:
    """A tiny residual chain with names like the real ResNet's (stage1_unitK_*)."""
    x = mx.sym.Variable("data")
    x = mx.sym.Convolution(x, num_filter=8, kernel=(3, 3), pad=(1, 1), name="stem_conv0")
    for u in range(1, units + 1):
        p = f"stage1_unit{u}"
        b = x
        for k in (1, 2):
            b = mx.sym.Convolution(b, num_filter=8, kernel=(3, 3), pad=(1, 1),
                                   name=f"{p}_conv{k}")
            b = mx.sym.BatchNorm(b, name=f"{p}_bn{k}")
            b = mx.sym.Activation(b, act_type="relu", name=f"{p}_act{k}")
        x = mx.sym.elemwise_add(x, b, name=f"{p}_sum")
    x = mx.sym.Pooling(x, global_pool=True, kernel=(1, 1), pool_type="avg", name="pool")
    x = mx.sym.FullyConnected(x, num_hidden=4, name="fc1")
    return mx.sym.SoftmaxOutput(x, name="softmax")


@pytest.fixture(scope="module")
def graph_source():
    return prepare(_resnet_like(12), data=(8, 3, 16, 16), softmax_label=(8,))


@pytest.fixture(scope="module")
def sqrt_plan(graph_source):
    p = graph_source.plan("sqrt")
    assert p.checkpoints and p.recomputed_ids, "the test graph should give a real plan"
    return p


@pytest.fixture(scope="module")
def cheap_plan(graph_source):
    return graph_source.plan("cheap")


def test_roles_styles_and_labels(sqrt_plan):
    nodes, edges = parse_dot(viz.to_dot(sqrt_plan))
    by_name = {a["tooltip"]: a for a in nodes.values()}
    assert len(nodes) == len(sqrt_plan.graph.op_nodes)
    for n in sqrt_plan.graph.op_nodes:
        a = by_name[n.name]
        if n.id in sqrt_plan.recomputed_ids:
            assert a["class"] == "recomputed"
            assert "dashed" in a["style"]
        elif n.name in sqrt_plan.checkpoints:
            assert a["class"] == "checkpoint"
            assert "bold" in a["style"]
        else:
            assert a["class"] == "kept"
            assert "dashed" not in a["style"] and "bold" not in a["style"]
        assert a["label"].startswith(n.name + "\\n" + n.op)
        assert re.search(r"\d+(\.\d)? (MB|KB)$", a["label"]), a["label"]
    fills = {c: {a["fillcolor"] for a in nodes.values() if a["class"] == c}
             for c in ("checkpoint", "recomputed")}
    assert len(fills["checkpoint"]) == 1 and len(fills["recomputed"]) == 1
    assert fills["checkpoint"] != fills["recomputed"]
    assert edges


def test_kept_nodes_look_different(cheap_plan):
    """cheap keeps convolutions: grey, solid, neither checkpoint nor recomputed."""
    nodes, _ = parse_dot(viz.to_dot(cheap_plan))
    classes = {a["tooltip"]: a["class"] for a in nodes.values()}
    assert classes["stage1_unit1_conv1"] == "kept"
    assert classes["stage1_unit1_bn1"] == "recomputed"
    styles = {a["class"]: (a["style"], a["fillcolor"]) for a in nodes.values()}
    assert styles["kept"] != styles["recomputed"]


def test_legend_and_segments(sqrt_plan):
    text = viz.to_dot(sqrt_plan)
    assert f"policy={sqrt_plan.policy}" in text
    assert f"baseline={sqrt_plan.baseline_mb:.0f} MB" in text
    assert f"planned={sqrt_plan.planned_mb:.0f} MB" in text
    seg = viz.segments(sqrt_plan)
    nseg = max(seg.values()) + 1
    assert nseg >= 2
    assert text.count("subgraph cluster_s") == nseg
    # segments are runs in forward order, each ending at a checkpoint but the last
    order = [n for n in sqrt_plan.graph.op_nodes]
    assert [seg[n.id] for n in order] == sorted(seg[n.id] for n in order)
    for s in range(nseg - 1):
        last = [n for n in order if seg[n.id] == s][-1]
        assert last.name in sqrt_plan.checkpoints


def test_collapse_has_far_fewer_nodes(sqrt_plan):
    full, _ = parse_dot(viz.to_dot(sqrt_plan))
    block, block_edges = parse_dot(viz.to_dot(sqrt_plan, collapse="block"))
    segment, _ = parse_dot(viz.to_dot(sqrt_plan, collapse="segment"))
    nseg = max(viz.segments(sqrt_plan).values()) + 1
    assert len(segment) == nseg
    # at most one box per residual unit and segment piece, plus the stem/head nodes
    assert len(block) <= 12 + nseg + 4
    assert len(block) * 4 < len(full)
    assert block_edges and all(a != b for a, b in block_edges)
    for a in segment.values():
        assert "striped" in a["style"]
        assert re.search(r"segment \d+ +\(\d+ nodes\)", a["label"])
        assert "recomputed" in a["label"]
    ckpt_boxes = [a for a in segment.values() if a["class"] == "group_checkpoint"]
    assert ckpt_boxes and all("bold" in a["style"] for a in ckpt_boxes)
    units = {a["label"].split("  (")[0] for a in block.values()}
    assert {f"stage1_unit{u}" for u in range(1, 13)} <= units
    assert len(parse_dot(viz.to_dot(sqrt_plan, collapse="prefix:1"))[0]) < len(full)


def test_block_keys():
    names = ["stem_conv0", "stem_act0", "stage1_unit1_conv1", "stage1_unit1_act_sc",
             "stage1_unit1_sum", "stage1_unit2_conv1", "t0_embed", "t0_l0_i2h",
             "t0_l0_c_tanh", "t0_l1_h", "t0_cls", "t1_embed", "t1_l0_h"]
    keys = [k.split("\x00")[0] for k in viz._block_keys(names)]
    assert keys == ["stem", "stem", "stage1_unit1", "stage1_unit1", "stage1_unit1",
                    "stage1_unit2", "t0", "t0", "t0", "t0", "t0", "t1", "t1"]


def test_deterministic(graph_source, sqrt_plan):
    again = graph_source.plan("sqrt")
    for collapse in (None, "block", "segment"):
        assert viz.to_dot(sqrt_plan, collapse) == viz.to_dot(sqrt_plan, collapse)
        assert viz.to_dot(again, collapse) == viz.to_dot(sqrt_plan, collapse)


def test_bad_collapse_and_format(sqrt_plan, tmp_path):
    with pytest.raises(PlanError, match="collapse"):
        viz.to_dot(sqrt_plan, collapse="layers")
    with pytest.raises(PlanError, match=r"\.svg"):
        viz.plot_plan(sqrt_plan, tmp_path / "plan.jpg")


def test_dot_file_written(sqrt_plan, tmp_path):
    path, note = viz.plot_plan(sqrt_plan, tmp_path / "plan.dot", collapse="block")
    assert path == tmp_path / "plan.dot" and note == ""
    assert path.read_text() == viz.to_dot(sqrt_plan, collapse="block")


def test_without_dot_writes_source(sqrt_plan, tmp_path, monkeypatch):
    monkeypatch.setattr(viz.shutil, "which", lambda name: None)
    path, note = viz.plot_plan(sqrt_plan, tmp_path / "plan.svg")
    assert path == tmp_path / "plan.dot" and "dot is not installed" in note
    assert path.read_text().startswith("digraph plan {")


@pytest.mark.skipif(not HAS_DOT, reason="graphviz 'dot' not installed")
@pytest.mark.parametrize("collapse", [None, "segment"])
def test_render_svg(sqrt_plan, tmp_path, collapse):
    path, note = viz.plot_plan(sqrt_plan, tmp_path / "plan.svg", collapse=collapse)
    assert note == ""
    svg = path.read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert 'class="node checkpoint"' in svg or 'class="node group_checkpoint"' in svg
    if collapse is None:
        assert 'class="node recomputed"' in svg
        assert svg.count('class="node ') == len(sqrt_plan.graph.op_nodes)


def test_timeline_data(sqrt_plan):
    data = timeline.timeline_data(sqrt_plan)
    base, planned = data["sharing"], data["plan"]
    assert planned.total_bytes == sqrt_plan.planned_bytes
    assert base.total_bytes == sqrt_plan.baseline_bytes
    assert max(planned.live) < max(base.live)
    assert max(base.live) <= base.total_bytes and max(planned.live) <= planned.total_bytes
    n_fwd = len(sqrt_plan.graph.op_nodes)
    assert base.backward_start == planned.backward_start == n_fwd
    assert len(planned.recompute_at) == len(sqrt_plan.recomputed_ids)
    assert len(planned.live) == len(base.live) + len(sqrt_plan.recomputed_ids)
    assert all(i >= n_fwd for i in planned.recompute_at)


def test_timeline_png(sqrt_plan, tmp_path):
    path = timeline.plot_timeline(sqrt_plan, tmp_path / "timeline.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_viz_command(graph_source, tmp_path, capsys):
    sym_file = tmp_path / "net.json"
    _resnet_like(12).save(str(sym_file))
    out = tmp_path / ("plan.svg" if HAS_DOT else "plan.dot")
    argv = ["viz", str(sym_file), "--shape", "data=8,3,16,16", "--shape", "softmax_label=8",
            "--policy", "sqrt", "-o", str(out), "--collapse", "segment",
            "--timeline", str(tmp_path / "t.png")]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "t.png" in printed
    assert out.stat().st_size > 0 and (tmp_path / "t.png").stat().st_size > 0
    assert cli.main(argv[:-2] + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["policy"] == "sqrt" and data["written"]["graph"] == str(out)


@pytest.mark.parametrize("extra, message", [
    ([], "nothing to draw"),
    (["-o", "{d}/x.jpg"], "give a file ending in"),
    (["-o", "{d}/x.svg", "--collapse", "steps"], "unknown collapse"),
    (["--timeline", "{d}/missing/t.png"], "does not exist"),
])
def test_viz_command_bad_input(tmp_path, capsys, extra, message):
    sym_file = tmp_path / "net.json"
    _resnet_like(2).save(str(sym_file))
    argv = ["viz", str(sym_file), "--shape", "data=8,3,16,16"]
    argv += [a.format(d=tmp_path) for a in extra]
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mxmirror: error: ") and message in err[-1]
    assert not list(Path(tmp_path).glob("x.*"))


def test_segmented_plan_draws(graph_source, tmp_path):
    """recursive plans run on the segmented executor: drawn, timeline without a plan curve."""
    p = graph_source.own_plan("recursive")  # the segmented plan, even where it loses
    nodes, _ = parse_dot(viz.to_dot(p))
    assert any(a["class"] == "recomputed" for a in nodes.values())
    data = timeline.timeline_data(p)
    assert data["plan"] is None and data["sharing"].total_bytes == p.baseline_bytes
    assert timeline.plot_timeline(p, tmp_path / "t.png").stat().st_size > 10_000


# ------------------------------------------------------------------ pictures a person can read
@pytest.fixture(scope="module")
def densenet_file(tmp_path_factory) -> Path:
    """DenseNet-121 of Gluon's model zoo (pretrained=False: nothing downloaded), 427 op
    nodes. Its last pooling takes 7x7, so 224x224 is the smallest input; the drawing's
    size does not depend on it."""
    from mxnet.gluon.model_zoo import vision

    path = tmp_path_factory.mktemp("densenet") / "densenet121-symbol.json"
    vision.densenet121(pretrained=False)(mx.sym.var("data")).save(str(path))
    return path


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_a_large_graph_is_drawn_collapsed_and_readable(densenet_file, tmp_path, capsys):
    """By default: one box per segment (blocks would be too many), at most ~10k px on its
    long side, and one line saying how to get every node."""
    out = tmp_path / "plan.png"
    assert cli.main(["viz", str(densenet_file), "--shape", "data=1,3,224,224", "-o",
                     str(out)]) == 0
    printed = capsys.readouterr().out
    m = re.search(r"wrote \S+plan\.png \((\d+) op nodes drawn as (\d+) boxes, one per "
                  r"segment; --collapse none draws every node\)", printed)
    assert m and int(m.group(1)) == 427 and int(m.group(2)) <= viz.MAX_BOXES, printed
    width, height = _png_size(out)
    assert 1000 < max(width, height) <= 10_000, (width, height)


def test_a_small_graph_is_drawn_whole(sqrt_plan):
    assert len(sqrt_plan.graph.op_nodes) <= viz.FULL_NODES
    nodes, _ = parse_dot(viz.to_dot(sqrt_plan, "auto"))
    assert len(nodes) == len(sqrt_plan.graph.op_nodes)
    assert 'size="104,104"' in viz.to_dot(sqrt_plan, "auto")
    assert " size=" not in viz.to_dot(sqrt_plan, None)  # asked for every node: all of it


def test_no_graphviz_is_an_error_saying_where_the_dot_file_is(tmp_path):
    """`dot` hidden from PATH: exit code 2, the install hint and where the DOT source went."""
    sym_file = tmp_path / "net.json"
    _resnet_like(2).save(str(sym_file))
    (tmp_path / "bin").mkdir()
    proc = subprocess.run([sys.executable, "-m", "mxmirror", "viz", str(sym_file), "--shape",
                           "data=8,3,16,16", "-o", str(tmp_path / "plan.png")],
                          capture_output=True, text=True, timeout=300,
                          env=child_env(PATH=str(tmp_path / "bin")))
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"mxmirror: error: cannot draw {tmp_path / 'plan.png'}: "
                           f"Graphviz's dot is not installed (install Graphviz: apt-get "
                           f"install graphviz"), last
    assert f"wrote the DOT source to {tmp_path / 'plan.dot'} instead" in last
    assert (tmp_path / "plan.dot").read_text().startswith("digraph plan {")
    assert not (tmp_path / "plan.png").exists() and "Traceback" not in proc.stderr
