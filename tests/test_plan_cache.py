"""The disk plan cache: the same Plan as planning afresh, robust to bad files and races."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from mxmirror.adapter.learn import TemplateStore, learned_by
from mxmirror.adapter.reader import load_graph as load
from mxmirror.api import prepare
from mxmirror.planning import cache
from mxmirror.planning.cache import cache_path
from mxmirror.planning.registry import STRATEGIES
from symbols.chain import conv_chain
from symbols.resnet import resnet

SHAPES = {"data": (4, 3, 32, 32), "softmax_label": (4,)}


def _small():
    return resnet([3, 3, 3], bottleneck=False, num_classes=10, image_shape=(3, 32, 32))


def _fields(p) -> dict:
    out = p.to_dict()
    out.pop("plan_seconds")
    out.update(recomputed=sorted(p.recomputed_ids), baseline=p.baseline_bytes,
               notes=list(p.notes), kind=p.execution.kind, source=p.source_json,
               inputs=p.inputs)
    sp = getattr(p.execution, "segment_plan", None)
    if sp is not None:
        out.update(cuts=sp.cuts, tree=sp.tree, templates=sp.template_bytes,
                   blocks=sp.template_blocks, runs=sp.dry.runs, peak=sp.dry.peak_bytes,
                   planned=sp.planned_bytes)
    return out



def _key(policy: str, budget_bytes, prepared) -> str | None:
    """The name of the plan file the API keeps for these."""
    return cache.plan_key(policy, budget_bytes, prepared.source_json, prepared.inputs,
                          learned_by=learned_by())


@pytest.mark.parametrize("policy,budget", [("search", None), ("sqrt", None),
                                           ("recursive", None), ("multilevel", "6MB"),
                                           ("none", None)])
def test_cached_plan_equals_fresh_plan(policy, budget, monkeypatch) -> None:
    sym = _small()
    fresh = prepare(sym, **SHAPES).plan(policy, budget)  # planned (or read) and kept
    key = _key(fresh.policy, fresh_budget(budget), fresh)
    assert (cache.plans_dir() / f"{key}.json").exists()
    name = fresh.policy

    def refuse(a, b):
        raise AssertionError("planned again although the plan was kept")

    monkeypatch.setitem(STRATEGIES, name, refuse)
    again = prepare(sym, **SHAPES).plan(policy, budget)
    assert _fields(again) == _fields(fresh)
    monkeypatch.undo()
    # and the kept plan is the plan the strategy makes from scratch
    monkeypatch.setattr(cache, "plans_dir", lambda: None)
    scratch = prepare(sym, **SHAPES).plan(policy, budget)
    assert _fields(scratch) == _fields(fresh)


@pytest.mark.parametrize("policy,kind", [("search", "mirror"), ("recursive", "segmented")])
def test_a_kept_plan_is_read_without_reading_the_graph(policy, kind, monkeypatch) -> None:
    """mxmirror.plan of a kept plan reads the symbol and the file only (a restarted job, a
    bucket seen before); its Plan says the same, and binds (a segmented one rebuilds its
    segments from the graph then)."""
    import mxnet as mx

    import mxmirror
    from mxmirror import api

    sym, shapes = conv_chain(48), {"data": (8, 3, 16, 16), "softmax_label": (8,)}
    fresh = mxmirror.plan(sym, policy=policy, **shapes)
    assert fresh.execution.kind == kind
    reads = []
    monkeypatch.setattr(api, "load_graph", lambda *a, **k: reads.append(1) or load(*a, **k))
    again = mxmirror.plan(sym, policy=policy, **shapes)
    assert (again.to_dict() | {"plan_seconds": 0}) == (fresh.to_dict() | {"plan_seconds": 0})
    assert (again.summary(), again.mirrored, again.notes) == (fresh.summary(), fresh.mirrored,
                                                              fresh.notes)
    assert reads == []
    ex = again.bind(mx.cpu(), grad_req=again.inputs.grad_req, **shapes)
    ex.forward(is_train=True)
    ex.backward()
    assert reads == ([1] if kind == "segmented" else [])


def fresh_budget(budget):
    from mxmirror.planning.registry import parse_budget

    return parse_budget(budget)


def test_corrupt_file_warns_once_and_plans_again() -> None:
    sym = _small()
    p = prepare(sym, **SHAPES).plan("sqrt")
    file = cache.plans_dir() / f"{_key('sqrt', None, p)}.json"
    file.write_text('{"schema": 2, "mirror": [1, 2')  # cut short
    with pytest.warns(UserWarning, match="unreadable plan cache file") as caught:
        again = prepare(sym, **SHAPES).plan("sqrt")
    assert len([w for w in caught if "plan cache" in str(w.message)]) == 1
    assert _fields(again) == _fields(p)
    json.loads(file.read_text())  # rewritten whole
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare(sym, **SHAPES).plan("sqrt")


def test_off_writes_nothing(tmp_path, monkeypatch) -> None:
    folder = cache.plans_dir()
    before = sorted(folder.iterdir()) if folder.exists() else []
    monkeypatch.setenv("MXMIRROR_CACHE", "off")
    assert cache_path() is None and cache.plans_dir() is None
    p = prepare(_small(), **SHAPES).plan("cheap")
    assert _key("cheap", None, p) is None
    assert (sorted(folder.iterdir()) if folder.exists() else []) == before
    # the template store neither reads nor writes
    monkeypatch.setenv("MXMIRROR_CACHE", "OFF")
    off = TemplateStore("x", None)
    off.put_many({})
    off.load({"Convolution"})
    assert off.dir is None and off.data == {}
    monkeypatch.setenv("MXMIRROR_CACHE", str(tmp_path))
    assert TemplateStore("x", None).dir.parent == tmp_path


def test_the_template_store_reads_the_ops_asked_for(tmp_path, monkeypatch) -> None:
    """Templates are kept a file per op, and a process reads the files of its graph's ops
    only: the store's size on disk does not grow every planning process."""
    import mxnet as mx

    import mxmirror.adapter.reader as reader
    from mxmirror.ir.templates import Template

    learned = TemplateStore("x", tmp_path)
    monkeypatch.setattr(reader, "_store", learned)
    graph = mx.sym.Activation(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4),
                              act_type="relu")
    table = load(graph, {"data": (2, 3)}).templates
    ops = {f.stem for f in learned.dir.iterdir()}  # with the ops a segment may add
    assert {"Activation", "FullyConnected"} <= ops == {json.loads(k)["op"] for k in table}
    again = TemplateStore("x", tmp_path)
    again.load({"Activation"})
    assert {json.loads(k)["op"] for k in again.data} == {"Activation"}
    again.load(ops)
    assert set(again.data) == set(table)
    assert all(isinstance(t, Template) for t in again.data.values())
    # a further template of one op keeps the others of that op on disk
    key, tpl = next((k, t) for k, t in table.items() if json.loads(k)["op"] == "Activation")
    other = TemplateStore("x", tmp_path)
    other.put_many({key.replace("relu", "tanh"): tpl})
    last = TemplateStore("x", tmp_path)
    last.load({"Activation"})
    assert set(last.data) == {key, key.replace("relu", "tanh")}


WRITER = """
import sys
from pathlib import Path
from mxmirror.planning.cache import write_atomic
f, tag = Path(sys.argv[1]), sys.argv[2]
for i in range(150):
    write_atomic(f, '{"tag": "%s", "i": %d, "pad": "%s"}' % (tag, i, tag * 200000))
"""


def test_two_processes_writing_at_once_leave_a_valid_file(tmp_path) -> None:
    f = tmp_path / "plans" / "same.json"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(f), tag]) for tag in "ab"]
    seen = 0
    while any(p.poll() is None for p in procs):
        if f.exists():
            json.loads(f.read_text())  # never half a file
            seen += 1
    assert [p.wait() for p in procs] == [0, 0]
    rec = json.loads(f.read_text())
    assert rec["i"] == 149 and rec["tag"] in "ab"
    assert [x.name for x in f.parent.iterdir()] == ["same.json"]  # no temporary left


def test_dtypes_given_as_types_key_the_same_plan() -> None:
    """Module passes dtypes as numpy types: they key the plan as their names do."""
    import numpy as np

    sym = _small()
    by_type = prepare(sym, type_dict={"data": np.float32}, **SHAPES).plan("sqrt")
    key = _key("sqrt", None, by_type)
    assert (cache.plans_dir() / f"{key}.json").exists()
    by_name = prepare(sym, type_dict={"data": "float32"}, **SHAPES).plan("sqrt")
    assert _key("sqrt", None, by_name) == key


def test_pruning_drops_the_least_recently_used_plans(tmp_path, monkeypatch) -> None:
    """Beyond MAX_FILES plans the least recently used go; reading a plan keeps it."""
    import os

    monkeypatch.setattr(cache, "plans_dir", lambda: tmp_path)
    monkeypatch.setattr(cache, "MAX_FILES", 2)
    sym = _small()

    def file(policy: str):
        p = prepare(sym, **SHAPES).plan(policy)
        return tmp_path / f"{_key(policy, None, p)}.json"

    sqrt, cheap = file("sqrt"), file("cheap")
    os.utime(sqrt, (1000, 1000))  # written first, long ago
    os.utime(cheap, (2000, 2000))
    assert file("sqrt") == sqrt and sqrt.stat().st_mtime > 2000  # read: recently used
    none = file("none")
    assert sorted(tmp_path.glob("*.json")) == sorted([sqrt, none])


def test_pruning_bounds_the_bytes_and_keeps_the_newest(tmp_path) -> None:
    import os

    for i in range(5):
        f = tmp_path / f"{i}.json"
        f.write_text("x" * 1000)
        os.utime(f, (1000 + i, 1000 + i))
    (tmp_path / "4.json.abc.tmp").write_text("x" * 5000)  # another process's temporary
    cache.prune(tmp_path, max_files=10, max_bytes=2500)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["3.json", "4.json", "4.json.abc.tmp"]
    cache.prune(tmp_path, max_files=10, max_bytes=10)  # the newest stays whatever its size
    assert sorted(f.name for f in tmp_path.glob("*.json")) == ["4.json"]


PRUNER = """
import sys
from pathlib import Path
from mxmirror.planning import cache
from mxmirror.planning.cache import write_atomic
folder, tag = Path(sys.argv[1]), sys.argv[2]
for i in range(300):
    write_atomic(folder / f"{tag}{i}.json", '{"i": %d}' % i)
    cache.prune(folder, max_files=20)
"""


def test_two_processes_pruning_at_once(tmp_path) -> None:
    """Files another process deletes between listing and deleting are skipped, not raised."""
    procs = [subprocess.Popen([sys.executable, "-c", PRUNER, str(tmp_path), tag],
                              stderr=subprocess.PIPE, text=True) for tag in "ab"]
    assert [p.wait() for p in procs] == [0, 0], [p.stderr.read()[-500:] for p in procs]
    left = list(tmp_path.iterdir())
    # each process prunes after its last write; the other's last rename may land between
    # its listing and its deletions: at most one file over the bound
    assert 1 <= len(left) <= 21
    for f in left:
        json.loads(f.read_text())


FIRST_RUN = """
import os, sys
from mxmirror.adapter import children, symbol
symbol.load_mxnet()
early = [proc for proc, _ in children._early.values()]
print("started", len(early), flush=True)
if sys.argv[1] == "use":
    import mxmirror
    from symbols.resnet import resnet
    sym = resnet([1, 1, 1], bottleneck=False, num_classes=10, image_shape=(3, 32, 32))
    mxmirror.plan(sym, data=(4, 3, 32, 32))
    print("used", early[0].poll() is not None and not children._early, flush=True)
print("pid", early[0].pid if early else -1, flush=True)
"""


@pytest.mark.parametrize("use", ["use", "exit"])
def test_a_first_run_starts_the_learner_with_mxnet_and_stops_it(tmp_path, use) -> None:
    """No template kept: the learner starts before MXNet is imported (its own import then
    overlaps), is the child that learns, and one never asked is gone when the process is."""
    import os
    from pathlib import Path

    env = dict(os.environ, MXMIRROR_CACHE=str(tmp_path),
               PYTHONPATH=str(Path(__file__).parents[1]))
    out = subprocess.run([sys.executable, "-c", FIRST_RUN, use], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "started 1" in out.stdout
    if use == "use":
        assert "used True" in out.stdout
        assert list(tmp_path.glob("templates-mxnet-*/*.json"))
    pid = int(out.stdout.split("pid ")[1].split()[0])
    with pytest.raises(ProcessLookupError):  # stopped and reaped with its parent
        os.kill(pid, 0)
    again = subprocess.run([sys.executable, "-c", FIRST_RUN, "exit"], capture_output=True,
                           text=True, env=env, timeout=300)
    assert ("started 1" in again.stdout) == (use == "exit")  # templates kept: no early child
