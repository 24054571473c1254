#!/usr/bin/env python
"""Train a ResNet with MXNet's Module API, with an mxmirror recomputation plan.

Data come from an ImageNet-style RecordIO file (``mx.io.ImageRecordIter``;
make one with MXNet's ``tools/im2rec.py``) or, with ``--synthetic``, from one
random batch repeated.  The symbol is planned once by ``mxmirror.plan`` for
the training shapes and the planned symbol (the plan written as MXNet's own
``__force_mirroring__`` attributes) is bound by a plain ``mx.mod.Module``.

Every epoch prints (and ``--log-json`` records) the throughput, mxmirror's
predicted memory for the planned intermediates, MXNet's own figure for the
bound executor (``Total X MB allocated`` from ``debug_str``), the process's
peak resident memory (``resource.getrusage``), training accuracy and loss,
and validation accuracy when ``--data-val`` is given.  ``--model-prefix``
writes ``PREFIX-symbol.json`` and ``PREFIX-%04d.params`` every epoch.

Examples::

    python scripts/train_imagenet.py --data-train train.rec --data-val val.rec \\
        --depth 50 --batch-size 32 --mirror sqrt --model-prefix ckpt/resnet50
    python scripts/train_imagenet.py --synthetic --depth 152 --batch-size 8 \\
        --num-batches 20 --mirror budget --budget 1GB
    python scripts/train_imagenet.py --synthetic --image-shape 3,32,32 --depth 110 \\
        --basic --num-classes 10 --mirror sqrt          # CIFAR ResNet-110
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import time
from pathlib import Path

import _bootstrap  # noqa: F401 (this checkout importable)
import mxnet as mx
import numpy as np
from tqdm import tqdm

import mxmirror
from mxmirror.adapter.children import allocated_mb
from mxmirror.planning.registry import POLICIES
from symbols.resnet import resnet_by_depth


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (ru_maxrss is KB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def mxnet_planned_mb(mod: mx.mod.Module) -> int | None:
    """MXNet's own planned-intermediates figure for the first bound executor."""
    execs = getattr(getattr(mod, "_exec_group", None), "execs", None)
    if not execs:
        return None
    mb = allocated_mb(execs[0])
    return mb[0] if mb else None


class SyntheticIter(mx.io.DataIter):
    """The same random batch ``num_batches`` times per epoch (no decoding cost)."""

    def __init__(self, batch_size: int, image_shape: tuple, num_classes: int,
                 num_batches: int, seed: int = 0) -> None:
        super().__init__(batch_size)
        rng = np.random.RandomState(seed)
        self.data = mx.nd.array(rng.uniform(-1, 1, (batch_size, *image_shape)))
        self.label = mx.nd.array(rng.randint(0, num_classes, (batch_size,)))
        self.num_batches = num_batches
        self.cur = 0

    @property
    def provide_data(self):
        return [mx.io.DataDesc("data", self.data.shape)]

    @property
    def provide_label(self):
        return [mx.io.DataDesc("softmax_label", self.label.shape)]

    def reset(self) -> None:
        self.cur = 0

    def next(self) -> mx.io.DataBatch:
        if self.cur >= self.num_batches:
            raise StopIteration
        self.cur += 1
        return mx.io.DataBatch([self.data], [self.label], pad=0,
                               provide_data=self.provide_data,
                               provide_label=self.provide_label)


def record_iter(path: str, args, train: bool) -> mx.io.DataIter:
    return mx.io.ImageRecordIter(
        path_imgrec=path,
        data_shape=args.image_shape,
        batch_size=args.batch_size,
        shuffle=train,
        rand_crop=train,
        rand_mirror=train,
        mean_r=123.68, mean_g=116.779, mean_b=103.939,
        std_r=58.393, std_g=57.12, std_b=57.375,
        preprocess_threads=args.threads,
        round_batch=True,
        seed=args.seed,
    )


def epoch_batches(it: mx.io.DataIter, limit: int | None):
    for i, batch in enumerate(it):
        if limit is not None and i >= limit:
            break
        yield batch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data-train", help="training RecordIO file (.rec)")
    src.add_argument("--synthetic", action="store_true", help="random data, no file")
    p.add_argument("--data-val", help="validation RecordIO file (.rec)")
    p.add_argument("--depth", type=int, default=50,
                   help="ResNet depth (ImageNet bottleneck: 50, 101, 152, 200, 269, 1001 "
                        "or any 3n+2 >= 50; CIFAR: 6n+2 basic, 9n+2 bottleneck)")
    p.add_argument("--basic", action="store_true", help="basic blocks instead of bottleneck")
    p.add_argument("--image-shape", default="3,224,224",
                   help="C,H,W; H <= 32 builds the 3-stage CIFAR network")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--num-batches", type=int, default=None,
                   help="batches per epoch (default: the whole .rec; 20 with --synthetic)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", type=float, default=1e-4)
    p.add_argument("--mirror", default="none", choices=sorted(POLICIES),
                   help="mxmirror policy (none: MXNet's default plan)")
    p.add_argument("--budget", default=None, help="memory budget for --mirror budget, e.g. 1GB")
    p.add_argument("--model-prefix", default=None, help="checkpoint prefix (every epoch)")
    p.add_argument("--load-epoch", type=int, default=None,
                   help="resume from PREFIX-%%04d.params written by --model-prefix")
    p.add_argument("--log-json", default=None, help="write the per-epoch records here")
    p.add_argument("--threads", type=int, default=2, help="decoding threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    args.image_shape = tuple(int(x) for x in args.image_shape.split(","))
    if len(args.image_shape) != 3:
        p.error("--image-shape must be C,H,W")
    if args.mirror == "budget" and args.budget is None:
        p.error("--mirror budget needs --budget SIZE, e.g. --budget 1GB")
    if args.load_epoch is not None and args.model_prefix is None:
        p.error("--load-epoch needs --model-prefix")
    if args.synthetic and args.num_batches is None:
        args.num_batches = 20
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)

    sym = resnet_by_depth(args.depth, bottleneck=not args.basic,
                          num_classes=args.num_classes, image_shape=args.image_shape)
    shapes = {"data": (args.batch_size, *args.image_shape),
              "softmax_label": (args.batch_size,)}
    plan = mxmirror.plan(sym, args.mirror, budget=args.budget, **shapes)
    print(f"plan: {plan.policy}: predicted {plan.planned_mb:.0f} MB planned intermediates "
          f"(unplanned {plan.baseline_mb:.0f} MB), {len(plan.recomputed_ids)} nodes recomputed, "
          f"recompute ratio {plan.recompute_ratio:.2f}, planned in {plan.plan_seconds:.1f} s",
          flush=True)

    if args.synthetic:
        train = SyntheticIter(args.batch_size, args.image_shape, args.num_classes,
                              args.num_batches, args.seed)
        val = None
    else:
        train = record_iter(args.data_train, args, train=True)
        val = record_iter(args.data_val, args, train=False) if args.data_val else None

    mod = mx.mod.Module(plan.symbol, data_names=("data",), label_names=("softmax_label",),
                        context=mx.cpu())
    mod.bind(data_shapes=train.provide_data, label_shapes=train.provide_label)
    begin_epoch = 0
    if args.load_epoch is not None:
        _, arg_params, aux_params = mx.model.load_checkpoint(args.model_prefix,
                                                             args.load_epoch)
        mod.set_params(arg_params, aux_params)
        begin_epoch = args.load_epoch
    else:
        mod.init_params(initializer=mx.init.Xavier(rnd_type="gaussian", factor_type="in",
                                                   magnitude=2))
    mod.init_optimizer(optimizer="sgd", optimizer_params={
        "learning_rate": args.lr, "momentum": args.momentum, "wd": args.wd,
        "rescale_grad": 1.0 / args.batch_size})
    mxnet_mb = mxnet_planned_mb(mod)

    metric = mx.metric.create(["acc", "ce"])
    records = []
    for epoch in range(begin_epoch, begin_epoch + args.epochs):
        train.reset()
        metric.reset()
        samples = batches = 0
        start = time.perf_counter()
        bar = tqdm(epoch_batches(train, args.num_batches), total=args.num_batches,
                   desc=f"epoch {epoch}", unit="batch", disable=args.no_progress,
                   dynamic_ncols=True)
        for batch in bar:
            mod.forward_backward(batch)
            mod.update()
            mod.update_metric(metric, batch.label)  # waits for the outputs
            samples += args.batch_size - (batch.pad or 0)
            batches += 1
            bar.set_postfix(img_s=f"{samples / (time.perf_counter() - start):.1f}")
        bar.close()
        for arr in mod.get_outputs():
            arr.wait_to_read()
        seconds = time.perf_counter() - start
        rec = {"epoch": epoch, "batches": batches,
               "samples": samples, "seconds": round(seconds, 3),
               "samples_per_second": round(samples / seconds, 2) if seconds else 0.0,
               "policy": args.mirror, "predicted_mb": round(plan.planned_mb, 1),
               "unplanned_mb": round(plan.baseline_mb, 1), "mxnet_mb": mxnet_mb,
               "peak_rss_mb": round(peak_rss_mb(), 1)}
        rec.update({f"train_{k}": float(v) for k, v in metric.get_name_value()})
        if val is not None:
            val.reset()
            vmetric = mx.metric.create("acc")
            mod.score(val, vmetric)
            rec["val_accuracy"] = float(vmetric.get()[1])
        if args.model_prefix:
            Path(args.model_prefix).parent.mkdir(parents=True, exist_ok=True)
            mod.save_checkpoint(args.model_prefix, epoch + 1)
            rec["checkpoint"] = f"{args.model_prefix}-{epoch + 1:04d}.params"
        records.append(rec)
        print(f"epoch {epoch}: {rec['samples_per_second']:.1f} img/s, "
              f"planned {rec['predicted_mb']:.0f} MB (MXNet {mxnet_mb} MB), "
              f"peak RSS {rec['peak_rss_mb']:.0f} MB, "
              f"train acc {rec.get('train_accuracy', float('nan')):.3f} "
              f"ce {rec.get('train_cross-entropy', float('nan')):.3f}"
              + (f", val acc {rec['val_accuracy']:.3f}" if "val_accuracy" in rec else ""),
              flush=True)
    if args.log_json:
        Path(args.log_json).write_text(json.dumps(records, indent=1))
    return records


if __name__ == "__main__":
    main()
