"""End-to-end runs of the reproduction scripts on tiny inputs (in-process, fast)."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    path = ROOT / "scripts" / f"{name}.py"
    if str(path.parent) not in sys.path:  # as `python scripts/<name>.py` has it (_bootstrap)
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"_script_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses need the module registered
    spec.loader.exec_module(module)
    return module


def _make_rec(directory: Path, n: int = 16, classes: int = 2, size: int = 36) -> Path:
    """A tiny ImageNet-style .rec of generated JPEGs (PIL; mxnet's pack_img needs cv2)."""
    from PIL import Image

    rec_path, idx_path = directory / "tiny.rec", directory / "tiny.idx"
    rec = mx.recordio.MXIndexedRecordIO(str(idx_path), str(rec_path), "w")
    rng = np.random.RandomState(0)
    for i in range(n):
        label = i % classes
        img = (rng.rand(size, size, 3) * 60 + label * 150).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG")
        header = mx.recordio.IRHeader(0, float(label), i, 0)
        rec.write_idx(i, mx.recordio.pack(header, buf.getvalue()))
    rec.close()
    return rec_path


def test_train_imagenet_on_tiny_rec(tmp_path: Path) -> None:
    rec = _make_rec(tmp_path)
    prefix = tmp_path / "ckpt" / "r8"
    log = tmp_path / "log.json"
    train = _script("train_imagenet")
    common = ["--image-shape", "3,32,32", "--depth", "8", "--basic", "--num-classes", "2",
              "--batch-size", "4", "--mirror", "sqrt", "--no-progress",
              "--model-prefix", str(prefix)]
    records = train.main(["--data-train", str(rec), "--data-val", str(rec), "--epochs", "2",
                          "--num-batches", "3", "--log-json", str(log), *common])
    assert json.loads(log.read_text()) == records
    assert [r["epoch"] for r in records] == [0, 1]
    for r in records:
        assert r["batches"] == 3 and r["samples"] == 12
        assert r["samples_per_second"] > 0 and r["peak_rss_mb"] > 0
        assert 0 < r["predicted_mb"] < r["unplanned_mb"]
        assert r["mxnet_mb"] is not None
        assert np.isfinite(r["train_cross-entropy"]) and 0 <= r["val_accuracy"] <= 1
    assert (tmp_path / "ckpt" / "r8-0002.params").exists()
    # The checkpoint carries the plan and resumes.
    saved = json.loads(mx.sym.load(f"{prefix}-symbol.json").tojson())
    assert any(n.get("attrs", {}).get("__force_mirroring__") == "True"
               for n in saved["nodes"])
    resumed = train.main(["--data-train", str(rec), "--epochs", "1", "--num-batches", "1",
                          "--load-epoch", "2", *common])
    assert resumed[0]["epoch"] == 2 and (tmp_path / "ckpt" / "r8-0003.params").exists()


def test_train_imagenet_synthetic_budget() -> None:
    train = _script("train_imagenet")
    records = train.main(["--synthetic", "--image-shape", "3,32,32", "--depth", "8",
                          "--basic", "--num-classes", "3", "--batch-size", "2",
                          "--num-batches", "2", "--mirror", "budget", "--budget", "3MB",
                          "--no-progress"])
    assert records[0]["batches"] == 2 and records[0]["predicted_mb"] <= 3


def test_train_imagenet_bad_args() -> None:
    train = _script("train_imagenet")
    with pytest.raises(SystemExit):
        train.parse_args(["--synthetic", "--mirror", "budget"])


def _ptb_dir(directory: Path) -> Path:
    rng = np.random.RandomState(1)
    words = [f"w{i}" for i in range(12)] + ["<unk>"]
    for name, n in (("ptb.train.txt", 60), ("ptb.valid.txt", 12)):
        lines = [" ".join(rng.choice(words, rng.randint(3, 9))) for _ in range(n)]
        (directory / name).write_text("\n".join(lines) + "\n")
    return directory


@pytest.mark.parametrize("bucketing", [False, True], ids=["fixed", "bucketing"])
def test_train_ptb_tiny_corpus(tmp_path: Path, bucketing: bool) -> None:
    ptb = _script("train_ptb")
    data = _ptb_dir(tmp_path)
    args = ["--data-dir", str(data), "--num-layers", "1", "--num-hidden", "8",
            "--num-embed", "8", "--batch-size", "4", "--epochs", "2", "--num-batches", "3",
            "--mirror", "sqrt", "--no-progress", "--lr", "0.1",
            "--model-prefix", str(tmp_path / "ckpt" / "lm"),
            "--log-json", str(tmp_path / "lm.json")]
    args += ["--bucketing", "--buckets", "5,10"] if bucketing else ["--seq-len", "6"]
    records = ptb.main(args)
    assert len(records) == 2
    for r in records:
        assert 1 < r["train_perplexity"] < 100 and np.isfinite(r["valid_perplexity"])
        assert r["batches"] == 3 and r["words"] > 0 and r["peak_rss_mb"] > 0
        assert all(0 < mb for mb in r["predicted_mb"].values())
    assert (tmp_path / "ckpt" / "lm-0002.params").exists()
    assert json.loads((tmp_path / "lm.json").read_text())[1]["epoch"] == 1


def test_train_ptb_synthetic_and_missing_files(tmp_path: Path) -> None:
    ptb = _script("train_ptb")
    records = ptb.main(["--synthetic", "--synthetic-sentences", "60", "--num-layers", "1",
                        "--num-hidden", "8", "--num-embed", "8", "--batch-size", "4",
                        "--seq-len", "5", "--num-batches", "2", "--mirror", "cheap",
                        "--no-progress"])
    assert records[0]["batches"] == 2
    with pytest.raises(SystemExit, match="ptb.train.txt"):
        ptb.main(["--data-dir", str(tmp_path)])


def test_paper_figures_quick(tmp_path: Path) -> None:
    figures = _script("paper_figures")
    summary = figures.main(["--quick", "--out", str(tmp_path)])
    for stem in ("fig5_resnet_memory", "fig6_lstm_memory", "fig7_time"):
        for ext in ("csv", "md", "png"):
            assert (tmp_path / f"{stem}.{ext}").stat().st_size > 0, f"{stem}.{ext}"
    fig5 = summary["fig5"]
    for r in fig5:
        # The paper's ordering: each strategy needs no more than the one before.
        assert r["none"] >= r["inplace"] >= r["sharing"] >= r["cheap"] >= r["sqrt"]
        assert r["optimal"] <= r["sqrt"] * 1.001
    measured = [r for r in fig5 if r["mxnet_sharing"] is not None]
    assert measured, "no MXNet bind in quick mode"
    for r in measured:  # MXNet prints whole MB, floored
        assert 0 <= r["sharing"] - r["mxnet_sharing"] < 1
        assert 0 <= r["sqrt"] - r["mxnet_sqrt"] < 1
    assert all(r["recursive"] > 0 and r["recursive_recompute"] > 0 for r in fig5)
    with open(tmp_path / "fig6_lstm_memory.csv") as f:
        made = f.readline()
        rows = list(csv.DictReader(f))
    assert made.startswith("# Generated by `python scripts/paper_figures.py --quick")
    assert [int(r["steps"]) for r in rows] == figures.QUICK["lstm_steps"]
    assert all(float(r["recursive"]) > 0 for r in rows)
    assert all(r["time_ratio"] > 0 for r in summary["fig7"])
    # The command names no path of this machine: the temporary --out shows as .../NAME.
    command = f"python scripts/paper_figures.py --quick --out .../{tmp_path.name}"
    for stem in ("fig5_resnet_memory", "fig6_lstm_memory", "fig7_time"):
        text = (tmp_path / f"{stem}.md").read_text()
        assert f"Generated by `{command}` at commit `" in text, stem
    record = json.loads((tmp_path / "summary.json").read_text())
    assert set(record["runs"]) == {"fig5", "fig6", "fig7"}
    assert {r["command"] for r in record["runs"].values()} == {command}
    assert str(tmp_path.parent) not in json.dumps(record)
    # A later run of one figure into the same directory keeps the others' rows and records.
    again = figures.main(["--quick", "--figs", "7", "--out", str(tmp_path)])
    assert again["fig5"] == record["fig5"] and again["runs"]["fig6"] == record["runs"]["fig6"]
    assert again["runs"]["fig7"]["command"].endswith("--figs 7 --out .../" + tmp_path.name)


def test_results_files_name_command_and_commit(tmp_path: Path) -> None:
    """Every results file starts from scripts/provenance.py's line: the command to rerun
    and the commit (marked when the checkout has uncommitted changes)."""
    provenance = _script("provenance")
    line = provenance.generated_by("scripts/x.py", ["--out", "a b"])
    assert line.startswith("Generated by `python scripts/x.py --out 'a b'` at commit `")
    # Absolute paths: relative inside the checkout, only their name outside it.
    shown = provenance.command("scripts/x.py", ["--out", str(ROOT / "docs" / "figures"),
                                                f"--log={tmp_path / 'log.json'}", "-v"])
    assert shown == "python scripts/x.py --out docs/figures --log=.../log.json -v"
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()
    assert head and provenance.commit().split()[0] == head


def test_recursive_depth_and_steps_write_their_tables(tmp_path: Path) -> None:
    """`depth --out` and `steps --out`: the printed tables, a real step per policy in a
    child, under the command and commit that made them."""
    bench = _script("recursive_benchmark")
    out = tmp_path / "depth.md"
    bench.main(["depth", "--kmax", "3", "--sqrt-kmax", "3", "--run-kmax", "3", "--batch", "2",
                "--out", str(out)])
    text = out.read_text()
    assert text.startswith("Generated by `python scripts/recursive_benchmark.py depth --kmax 3 "
                           "--sqrt-kmax 3 --run-kmax 3 --batch 2 --out .../depth.md` at commit")
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| 3 |")]
    assert len(rows) == 3  # the prediction, then none and recursive stepped
    assert [r[1] for r in rows[1:]] == ["none", "recursive"]
    assert rows[1][2] == "Executor"  # plain MXNet
    assert all(float(r[3]) >= float(r[4]) > 0 for r in rows[1:]), rows  # peak >= growth
    out = tmp_path / "steps.md"
    bench.main(["steps", "--k", "2", "--batch", "2", "--out", str(out)])
    lines = [line for line in out.read_text().splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in lines[1:]] == [
        "| none", "| sqrt", "| recursive", "| multilevel"]
    assert "refused" not in "".join(lines[1:4])  # only multilevel's budget may be refused


def test_long_run_and_bn_race_write_their_tables(tmp_path: Path) -> None:
    long_run = _script("long_run")
    out = tmp_path / "long_run.md"
    assert long_run.main(["--steps", "3", "--batch", "64", "--policy", "sqrt",
                          "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("Generated by `python scripts/long_run.py --steps 3 --batch 64 "
                           "--policy sqrt --out .../long_run.md` at commit `")
    assert "| sqrt | " in text and "Exit code 0" in text
    race = _script("bn_race")
    out = tmp_path / "race.md"
    # large enough that the plan is bound (it saves more than its mirror copies' structures)
    assert race.main(["--policy", "sqrt", "--repeats", "1", "--steps", "2", "--layers", "4",
                      "--filters", "16", "--size", "16", "--batch", "16", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("Generated by `") and "python scripts/bn_race.py --policy sqrt" in text
    assert "| plain MXNet | - | " in text and "| mxmirror `sqrt` | on | " in text
    assert "| sqrt | on | " in text  # the step table


def test_layout_sensitivity_writes_both_mkldnn_settings(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("a\n<!-- layout_sensitivity: start -->\n<!-- layout_sensitivity: end -->\nb\n")
    _script("layout_sensitivity").main(["--depth", "8", "--batch", "2", "--steps", "1",
                                        "--out", str(page)])
    rows = [line for line in page.read_text().splitlines() if line.startswith("| o")]
    assert [r.split(" | ")[:2] for r in rows] == [["| on", "1"], ["| off", "1"]]
    # MKL-DNN off: the segmented plan's gradients are bitwise plain MXNet's; the nudged
    # unplanned run differs (the comparison can see a difference)
    off = rows[1].split(" | ")
    assert off[2] == "0.0e+00 / 0.0e+00" and off[3] != "0.0e+00 / 0.0e+00"
