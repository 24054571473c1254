"""MXNet 1.9.1's own Gluon example scripts, unchanged, plain and under `mxmirror run`.

Give the folder example/gluon of MXNet 1.9.1 (e.g. from
`git clone --depth 1 -b 1.9.1 https://github.com/apache/mxnet`); the scripts are copied
into a temporary folder and run there, never into this repository. Their datasets are
generated in that folder, in the formats the scripts read: MNIST's idx files for
image_classification.py (hybrid mode, and symbolic mode, which trains with Module), and
WikiText-2's token files for word_language_model/train.py --hybridize (whose dataset
class checks the files' SHA-1 against the real ones: a launcher replaces that check,
and nothing else, before running the script). Each runs twice, plain and under
`python -m mxmirror run --policy sqrt`; the table lists every metric line both print
(they must be equal) and mxmirror's log lines, which say what was planned.

    python scripts/gluon_examples.py --examples DIR [--out docs/gluon.md]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _bootstrap import ROOT
from provenance import generated_by, write_section

LAUNCHER = """import runpy, sys
import mxnet.gluon.contrib.data.text as text
text.check_sha1 = lambda *args, **kwargs: True  # generated token files, not WikiText-2's
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""
RUNS = [  # (label, files to copy, command after `python`, what a metric line matches)
    ("image_classification.py --mode hybrid", ["image_classification.py", "data.py"],
     ["image_classification.py", "--dataset", "mnist", "--model", "resnet18_v1",
      "--mode", "hybrid", "--epochs", "2", "--batch-size", "32", "--log-interval", "20",
      "--save-frequency", "0"], r"(training|validation): "),
    ("image_classification.py --mode symbolic", ["image_classification.py", "data.py"],
     ["image_classification.py", "--dataset", "mnist", "--model", "resnet18_v1",
      "--mode", "symbolic", "--epochs", "2", "--batch-size", "32", "--log-interval", "20"],
     r"(Train|Validation)-"),
    ("word_language_model/train.py --hybridize", ["word_language_model/train.py",
                                                  "word_language_model/model.py"],
     ["launcher.py", "train.py", "--hybridize", "--emsize", "64", "--nhid", "64",
      "--epochs", "2", "--batch_size", "20", "--bptt", "35", "--log-interval", "20"],
     r"(loss|ppl)"),
]


def mnist(folder: Path, train: int = 1280, test: int = 320) -> None:
    """idx files of a learnable 10-class task: class k lights up row band k."""
    rs = np.random.RandomState(0)
    (folder / "data").mkdir()
    for prefix, n in (("train", train), ("t10k", test)):
        labels = rs.randint(0, 10, n).astype(np.uint8)
        images = (rs.rand(n, 28, 28) * 80).astype(np.uint8)
        for i, k in enumerate(labels):
            images[i, 2 + 2 * k:4 + 2 * k, :] = 255
        (folder / "data" / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
        (folder / "data" / f"{prefix}-labels-idx1-ubyte").write_bytes(
            struct.pack(">II", 2049, n) + labels.tobytes())


def wikitext(folder: Path) -> None:
    """Token files of a small Markov language over 200 words."""
    rs = np.random.RandomState(0)
    words = [f"w{i}" for i in range(200)]
    nxt = rs.randint(0, 200, (200, 3))
    (folder / "data").mkdir(exist_ok=True)
    for name, lines in (("train", 600), ("valid", 80), ("test", 80)):
        out, w = [], 0
        for _ in range(lines):
            line = []
            for _ in range(12):
                w = nxt[w, rs.randint(0, 3)]
                line.append(words[w])
            out.append(" ".join(line))
        (folder / "data" / f"wiki.{name}.tokens").write_text("\n".join(out) + "\n")


def run(examples: Path, label: str, files: list[str], command: list[str], metric: str,
        policy: str | None) -> tuple[list[str], list[str], float, str]:
    """The metric lines and mxmirror's lines of one run in a fresh temporary folder, and how
    it ended ("" or its exit code and last line: MXNet 1.9.1's symbolic mode trains, then
    fails on its own ``mod.save_parameters``, which Module does not have)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for f in files:
            shutil.copy(examples / f, folder / Path(f).name)
        (folder / "launcher.py").write_text(LAUNCHER)
        if "mnist" in command:
            mnist(folder)
        else:
            wikitext(folder)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MXMIRROR_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH"))
                                            if p)
        env["MXNET_SUBGRAPH_VERBOSE"] = "0"
        head = [sys.executable] + (["-m", "mxmirror", "run", "--policy", policy]
                                   if policy else [])
        t = time.perf_counter()
        proc = subprocess.run(head + command, cwd=folder, capture_output=True, text=True,
                              env=env, timeout=3600)
        seconds = time.perf_counter() - t
    lines = (proc.stdout + proc.stderr).splitlines()
    ended = ""
    if proc.returncode != 0:
        ended = f"exit {proc.returncode}: `{(proc.stderr.strip().splitlines() or [''])[-1]}`"
    found = [_metrics(line) for line in lines if re.search(metric, line) and
             not line.startswith("mxmirror")]
    return [m for m in found if m], [line for line in lines if line.startswith("mxmirror:")], \
        seconds, ended


def _metrics(line: str) -> str:
    """A metric line without what differs between runs (times, speeds)."""
    line = re.sub(r"^\S+ \S+ (INFO|WARNING) ", "", line)  # logging's time stamp
    line = re.sub(r"time cost [\d.]+s, ", "", line)
    line = re.sub(r"Speed: [\d.]+ samples/sec\s*", "", line)
    line = re.sub(r"Time cost=[\d.]+", "", line)
    return line.strip()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", required=True, help="MXNet 1.9.1's example/gluon folder")
    ap.add_argument("--policy", default="sqrt")
    ap.add_argument("--out", help="page whose marked section is rewritten")
    args = ap.parse_args(argv)
    examples = Path(args.examples)
    load = os.getloadavg()[0]
    lines = [generated_by("scripts/gluon_examples.py", sys.argv[1:] if argv is None else argv)
             + f" Load average {load:.1f} at the start (2 cores, shared).", "",
             f"| script (generated data) | metric lines, plain | the same under `mxmirror run "
             f"--policy {args.policy}`? | wall s plain / planned | mxmirror's lines |",
             "|---|---|---|---|---|"]
    for label, files, command, metric in RUNS:
        plain, noise, plain_s, plain_end = run(examples, label, files, command, metric, None)
        planned, said, planned_s, planned_end = run(examples, label, files, command, metric,
                                                    args.policy)
        assert not noise, noise
        same = "yes, all equal" if plain == planned and plain else \
            f"NO: {sum(a != b for a, b in zip(plain, planned))} differ"
        if plain_end or planned_end:  # the script's own end, the same in both or not
            same += (f"; both end {plain_end}" if plain_end == planned_end else
                     f"; NOT the same end: plain {plain_end or 'exit 0'}, planned "
                     f"{planned_end or 'exit 0'}")
        shown = "<br>".join(plain[-3:]) + (f" (last 3 of {len(plain)})" if len(plain) > 3
                                           else "")
        log = "<br>".join(sorted(set(said))) or "(none)"
        lines.append(f"| {label} | {shown} | {same} | {plain_s:.0f} / {planned_s:.0f} | {log} |")
        print(lines[-1], flush=True)
    write_section(args.out, "gluon_examples", lines)


if __name__ == "__main__":
    main()
