"""Distributed training of a planned symbol on MXNet's parameter-server kvstore, checked
against one process (tests/test_dist.py runs it; docs/distributed.md cites its file).

On loopback: 1 scheduler, 1 server and 2 workers as subprocesses, with the DMLC_*
variables MXNet's launcher (tools/launch.py) sets. Each worker trains a Module with
``kvstore='dist_sync'`` inside ``mxmirror.enabled(policy)`` on its half of every global
batch; worker 0 saves its parameters. They must equal a single-process run over the
whole global batch (Module sets rescale_grad = 1 / global batch in both cases). Under
``sqrt`` an MLP binds MXNet's executor with mirror attributes; under ``recursive`` a deep
conv chain (no BatchNorm, whose batch statistics would differ per worker) binds the
segmented executor.

    python scripts/dist_sync.py [--policy sqrt --policy recursive] [--out docs/figures/dist_sync.md]

``python scripts/dist_sync.py worker OUT.npz POLICY`` is the worker (run by the cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _bootstrap import ROOT
from provenance import generated_by

STEPS = 4
GLOBAL_BATCH = 128  # large enough that the plans save more than their mirror copies cost
FEATURES = 64
CLASSES = 10
TIMEOUT = 90  # seconds for the whole cluster


def net(policy: str = "sqrt"):
    import mxnet as mx

    if policy == "recursive":
        from symbols.chain import conv_chain

        return conv_chain(48, 8, CLASSES, batchnorm=False)
    x = mx.sym.var("data")
    for i in range(5):
        x = mx.sym.Activation(mx.sym.FullyConnected(x, num_hidden=1024, name=f"fc{i}"),
                              act_type="relu", name=f"relu{i}")
    x = mx.sym.FullyConnected(x, num_hidden=CLASSES, name="out")
    return mx.sym.SoftmaxOutput(x, name="softmax")


def batches():
    """The same global batches everywhere (numpy seed, not MXNet's)."""
    rng = np.random.RandomState(7)
    return [(rng.uniform(-1, 1, (GLOBAL_BATCH, FEATURES)).astype("float32"),
             rng.randint(0, CLASSES, GLOBAL_BATCH).astype("float32")) for _ in range(STEPS)]


def data_shape(policy: str, batch: int) -> tuple:
    """The features as a vector, or as a one-channel 8x8 image for the conv chain."""
    return (batch, 1, 8, 8) if policy == "recursive" else (batch, FEATURES)


def initial_params(sym, policy: str = "sqrt"):
    rng = np.random.RandomState(3)
    arg_shapes, _, _ = sym.infer_shape(data=data_shape(policy, GLOBAL_BATCH))
    import mxnet as mx

    scale = 0.3 if policy == "recursive" else 0.1  # 48 conv-ReLU layers keep their scale
    return {n: mx.nd.array(rng.uniform(-scale, scale, s))
            for n, s in zip(sym.list_arguments(), arg_shapes)
            if n not in ("data", "softmax_label")}


def train(kvstore: str, rank: int = 0, num_workers: int = 1,
          policy: str = "sqrt") -> tuple[dict, int]:
    """Train STEPS steps on this worker's slice; return the parameters and how many nodes
    the bound executor recomputes (mirrored nodes, or the segmented plan's)."""
    import mxnet as mx

    import mxmirror

    sym = net(policy)
    local = GLOBAL_BATCH // num_workers
    with mxmirror.enabled(policy):
        mod = mx.mod.Module(sym, context=mx.cpu())
        mod.bind(data_shapes=[("data", data_shape(policy, local))],
                 label_shapes=[("softmax_label", (local,))])
    mod.init_params(arg_params=initial_params(sym, policy), allow_missing=False)
    mod.init_optimizer(kvstore=kvstore, optimizer="sgd",
                       optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
    for data, label in batches():
        part = slice(rank * local, (rank + 1) * local)
        x = data[part].reshape(data_shape(policy, local))
        mod.forward_backward(mx.io.DataBatch([mx.nd.array(x)], [mx.nd.array(label[part])]))
        mod.update()
    args, _ = mod.get_params()
    ex = mod._exec_group.execs[0]
    if hasattr(ex, "plan"):  # the segmented executor: nodes of the segments run again
        sp = ex.plan
        mirrored = sum(len(seg.nodes) for seg, runs in zip(sp.segments.segments, sp.dry.runs)
                       if runs > 1)
    else:
        bound = ex._symbol.attr_dict()
        mirrored = sum(1 for a in bound.values() if a.get("__force_mirroring__") == "True")
    return {k: v.asnumpy() for k, v in args.items()}, mirrored


def worker(out: str, policy: str) -> None:
    import mxnet as mx

    kv = mx.kv.create("dist_sync")
    params, mirrored = train(kv, kv.rank, kv.num_workers, policy)
    if kv.rank == 0:
        np.savez(out, **params)
        Path(out + ".json").write_text(json.dumps({"mirrored": mirrored,
                                                   "num_workers": kv.num_workers}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_env(role: str, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_"))}
    env.update(DMLC_ROLE=role, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port),
               DMLC_NUM_SERVER="1", DMLC_NUM_WORKER="2", DMLC_NODE_HOST="127.0.0.1",
               OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p))
    env.pop("MXMIRROR_POLICY", None)
    return env


def run_cluster(out: Path, policy: str) -> list[subprocess.CompletedProcess | str]:
    """Scheduler, server, two workers; every process killed on the way out."""
    port = _free_port()
    procs = []
    logs = []
    try:
        for role in ("scheduler", "server", "worker", "worker"):
            cmd = ([sys.executable, "-c", "import mxnet"] if role != "worker"
                   else [sys.executable, str(Path(__file__).resolve()), "worker", str(out), policy])
            log = open(out.parent / f"{role}{len(procs)}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen(cmd, env=_cluster_env(role, port), cwd=ROOT,
                                          stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline = time.monotonic() + TIMEOUT
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    texts = []
    for log in logs:
        log.seek(0)
        texts.append(log.read())
        log.close()
    return [(p.returncode, t) for p, t in zip(procs, texts)]


RTOL, ATOL = 1e-5, 1e-6  # the workers' sums are taken in another order than one process's


def compare(policy: str, folder: Path) -> dict:
    """Run the cluster and the single process; what a reader (and the test) checks."""
    out = folder / f"worker0_{policy}.npz"
    t = time.perf_counter()
    results = run_cluster(out, policy)
    seconds = time.perf_counter() - t
    row: dict = {"policy": policy, "exit_codes": [code for code, _ in results],
                 "cluster_seconds": round(seconds, 1)}
    if any(code != 0 for code, _ in results):
        row["logs"] = [text[-2000:] for _, text in results]
        return row
    info = json.loads(Path(str(out) + ".json").read_text())
    dist = dict(np.load(out))
    single, mirrored = train("local", policy=policy)
    start = {k: v.asnumpy() for k, v in initial_params(net(policy), policy).items()}
    worst = {k: float(np.abs(dist[k] - single[k]).max()) for k in single if k in dist}
    row.update(num_workers=info["num_workers"], mirrored=info["mirrored"],
               single_mirrored=mirrored, parameters=len(single),
               same_names=dist.keys() == single.keys(),
               least_training_move=min(float(np.abs(single[k] - start[k]).max())
                                       for k in start),
               max_abs_diff=max(worst.values()),
               within_tolerance=all(np.allclose(dist[k], single[k], rtol=RTOL, atol=ATOL)
                                    for k in single if k in dist))
    return row


def markdown(rows: list[dict]) -> list[str]:
    lines = [f"`dist_sync` on loopback (1 scheduler, 1 server, 2 workers), {STEPS} SGD steps "
             f"with momentum, global batch {GLOBAL_BATCH} split between the workers; worker 0's "
             "parameters against one process over the whole batch "
             f"(equal within rtol {RTOL:g}, atol {ATOL:g}).", "",
             "| policy | network | recomputed nodes (workers / one process) | parameters | "
             "max abs diff | within tolerance | least parameter move by training | "
             "cluster s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        network = ("48-layer conv chain, 8x8 (segmented executor)" if r["policy"] == "recursive"
                   else "6-layer FullyConnected/ReLU MLP (MXNet mirroring)")
        if "logs" in r:
            lines.append(f"| {r['policy']} | {network} | cluster failed: exit codes "
                         f"{r['exit_codes']} | | | | | {r['cluster_seconds']} |")
            continue
        lines.append(f"| {r['policy']} | {network} | {r['mirrored']} / {r['single_mirrored']} "
                     f"| {r['parameters']} | {r['max_abs_diff']:.3g} | "
                     f"{'yes' if r['within_tolerance'] else 'no'} | "
                     f"{r['least_training_move']:.3g} | {r['cluster_seconds']} |")
    return lines


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", action="append", help="repeatable; default sqrt, recursive")
    ap.add_argument("--out", help="also write the table, with command and commit, here")
    given = sys.argv[1:] if argv is None else argv
    a = ap.parse_args(given)
    with tempfile.TemporaryDirectory(prefix="mxmirror-dist-") as folder:
        rows = [compare(p, Path(folder)) for p in a.policy or ["sqrt", "recursive"]]
    lines = markdown(rows)
    print("\n".join(lines))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text("\n".join([generated_by("scripts/dist_sync.py", given), "",
                                           *lines]) + "\n")
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main()
