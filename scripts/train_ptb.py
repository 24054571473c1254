#!/usr/bin/env python
"""Word-level LSTM language model on PTB-format text, with an mxmirror plan.

PTB format: ``ptb.train.txt`` / ``ptb.valid.txt`` (/ ``ptb.test.txt``) in
``--data-dir``, one sentence a line, words separated by spaces, rare words
already replaced by ``<unk>``; an ``<eos>`` is appended to every line.  Words
of the validation and test text missing from the training vocabulary become
``<unk>``.  ``--synthetic`` generates a small corpus instead.

Two ways to unroll:

* fixed (default): the training text is one stream cut into ``--batch-size``
  rows and windows of ``--seq-len`` words (a ``Module`` of one unrolled graph);
* ``--bucketing``: one sentence a row, padded to the next of ``--buckets``
  (``mx.rnn.BucketSentenceIter`` + ``BucketingModule``, one graph per bucket,
  every bucket planned for its own length); padding is label 0 and is ignored
  by the loss and by the perplexity.

Every window starts from zero LSTM states (no state is carried across
batches), as in MXNet's own bucketing example.  The symbol is
``symbols.lstm.ptb_lm`` with ``begin_state="from_data"``; each graph is
planned by ``mxmirror.plan`` for its shapes and the planned symbol is handed
to the module.  Per epoch: train and validation perplexity, words per second,
predicted and MXNet-planned memory of the largest graph, peak RSS.

Examples::

    python scripts/train_ptb.py --data-dir data/ptb --seq-len 35 --mirror sqrt
    python scripts/train_ptb.py --data-dir data/ptb --bucketing --buckets 10,20,40,80 \\
        --mirror optimal --model-prefix ckpt/ptb
    python scripts/train_ptb.py --synthetic --epochs 2 --mirror sqrt
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import _bootstrap  # noqa: F401 (this checkout importable)
import mxnet as mx
import numpy as np
from tqdm import tqdm

import mxmirror
from mxmirror.adapter.children import allocated_mb
from mxmirror.ir.symbol_json import annotate_json
from mxmirror.planning.registry import POLICIES
from mxmirror.sim import memory_plan, training_graph
from symbols.lstm import ptb_lm

PAD, PAD_ID, EOS, UNK = "<pad>", 0, "<eos>", "<unk>"


# ------------------------------------------------------------------ data
def read_sentences(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8") as f:
        return [line.split() + [EOS] for line in f if line.strip()]


def build_vocab(sentences: list[list[str]]) -> dict[str, int]:
    vocab = {PAD: PAD_ID, UNK: 1, EOS: 2}
    for sent in sentences:
        for w in sent:
            vocab.setdefault(w, len(vocab))
    return vocab


def encode(sentences: list[list[str]], vocab: dict[str, int]) -> list[list[int]]:
    unk = vocab[UNK]
    return [[vocab.get(w, unk) for w in s] for s in sentences]


def synthetic_corpus(num_sentences: int, vocab_size: int, seed: int) -> list[list[str]]:
    """Sentences from a sparse Markov chain: learnable, so perplexity falls."""
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(num_sentences):
        w = rng.randint(vocab_size)
        sent = []
        for _ in range(rng.randint(3, 25)):
            sent.append(f"w{w}")
            w = (w + rng.choice([1, 2, 7])) % vocab_size
        out.append(sent + [EOS])
    return out


class StreamIter(mx.io.DataIter):
    """Fixed unroll: the text as one stream, ``batch_size`` rows, windows of ``seq_len``."""

    def __init__(self, ids: list[int], batch_size: int, seq_len: int) -> None:
        super().__init__(batch_size)
        n = (len(ids) - 1) // batch_size
        if n < seq_len:
            raise SystemExit(f"train_ptb: error: text too short for batch {batch_size} x "
                             f"seq-len {seq_len} ({len(ids)} words)")
        stream = np.asarray(ids[: n * batch_size + 1], dtype=np.float32)
        self.x = stream[:-1].reshape(batch_size, n)
        self.y = stream[1:].reshape(batch_size, n)
        self.seq_len = seq_len
        self.num_batches = n // seq_len
        self.cur = 0
        self.default_bucket_key = seq_len

    @property
    def provide_data(self):
        return [mx.io.DataDesc("data", (self.batch_size, self.seq_len))]

    @property
    def provide_label(self):
        return [mx.io.DataDesc("softmax_label", (self.batch_size, self.seq_len))]

    def reset(self) -> None:
        self.cur = 0

    def next(self) -> mx.io.DataBatch:
        if self.cur >= self.num_batches:
            raise StopIteration
        s = slice(self.cur * self.seq_len, (self.cur + 1) * self.seq_len)
        self.cur += 1
        return mx.io.DataBatch([mx.nd.array(self.x[:, s])], [mx.nd.array(self.y[:, s])],
                               pad=0, bucket_key=self.seq_len,
                               provide_data=self.provide_data,
                               provide_label=self.provide_label)


def bucket_iter(ids: list[list[int]], args) -> mx.rnn.BucketSentenceIter:
    fitting = [s for s in ids if len(s) <= max(args.buckets)]
    if len(fitting) < len(ids):
        logging.info("%d sentences longer than %d words skipped", len(ids) - len(fitting),
                     max(args.buckets))
    return mx.rnn.BucketSentenceIter(fitting, args.batch_size, buckets=list(args.buckets),
                                     invalid_label=PAD_ID, data_name="data",
                                     label_name="softmax_label", layout="NT")


# ------------------------------------------------------------------ model
@dataclass
class Planned:
    """One graph's plan as trained: the symbol and its simulated figures."""

    policy: str
    symbol: mx.sym.Symbol
    recomputed_ids: set[int]
    planned_mb: float
    baseline_mb: float


# A mirrored Embedding breaks MXNet 1.9.1's is_train=False forward ("Check failed:
# req[embedding::kOut] == kWriteTo"), so its output is kept (a checkpoint) instead.
KEEP_OPS = ("Embedding",)


def plan_symbol(sym: mx.sym.Symbol, policy: str, budget, shape: tuple) -> Planned:
    """mxmirror's plan of ``sym``, minus KEEP_OPS, re-simulated as MXNet will run it."""
    p = mxmirror.plan(sym, policy, budget=budget, data=shape, softmax_label=shape)
    ops = {n.id: n.op for n in p.graph.nodes}
    ids = {i for i in p.recomputed_ids if ops.get(i) not in KEEP_OPS}
    planned = p.planned_bytes
    if ids != p.recomputed_ids:
        planned = memory_plan.simulate(training_graph.build(p.graph, ids), "sharing").total_bytes
    return Planned(p.policy, mx.sym.load_json(annotate_json(p.source_json, ids)), ids,
                   planned / 2**20, p.baseline_mb)


class Planner:
    """sym_gen for (Bucketing)Module: the ptb_lm graph of a length, planned by mxmirror."""

    def __init__(self, args, vocab_size: int) -> None:
        self.args = args
        self.vocab_size = vocab_size
        self.plans: dict[int, Planned] = {}

    def __call__(self, seq_len: int):
        a = self.args
        if seq_len not in self.plans:
            sym = ptb_lm(seq_len, self.vocab_size, num_layers=a.num_layers,
                         num_hidden=a.num_hidden, num_embed=a.num_embed, dropout=a.dropout,
                         begin_state="from_data", ignore_label=PAD_ID)
            self.plans[seq_len] = plan_symbol(sym, a.mirror, a.budget, (a.batch_size, seq_len))
        return self.plans[seq_len].symbol, ("data",), ("softmax_label",)


def mxnet_planned_mb(module) -> int | None:
    """MXNet's own planned-intermediates figure for the default (largest) graph."""
    mod = getattr(module, "_curr_module", None) or module
    if isinstance(module, mx.mod.BucketingModule):
        mod = module._buckets.get(module._default_bucket_key, mod)
    execs = getattr(getattr(mod, "_exec_group", None), "execs", None)
    if not execs:
        return None
    mb = allocated_mb(execs[0])
    return mb[0] if mb else None


def perplexity(mod, it: mx.io.DataIter, limit: int | None) -> float:
    metric = mx.metric.Perplexity(ignore_label=PAD_ID)
    it.reset()
    for i, batch in enumerate(it):
        if limit is not None and i >= limit:
            break
        mod.forward(batch, is_train=False)
        mod.update_metric(metric, batch.label)
    return float(metric.get()[1])


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data-dir", help="directory with ptb.train.txt, ptb.valid.txt")
    src.add_argument("--synthetic", action="store_true", help="generated corpus, no files")
    p.add_argument("--synthetic-vocab", type=int, default=200)
    p.add_argument("--synthetic-sentences", type=int, default=400)
    p.add_argument("--seq-len", type=int, default=35, help="fixed unroll length")
    p.add_argument("--bucketing", action="store_true", help="BucketingModule over sentences")
    p.add_argument("--buckets", default="10,20,30,40,50,60",
                   help="bucket lengths for --bucketing")
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-hidden", type=int, default=200)
    p.add_argument("--num-embed", type=int, default=200)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--num-batches", type=int, default=None, help="batches per epoch")
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--wd", type=float, default=0.0)
    p.add_argument("--clip", type=float, default=5.0, help="gradient clipping")
    p.add_argument("--mirror", default="none", choices=sorted(POLICIES),
                   help="mxmirror policy (none: MXNet's default plan)")
    p.add_argument("--budget", default=None, help="memory budget for --mirror budget")
    p.add_argument("--model-prefix", default=None, help="checkpoint prefix (every epoch)")
    p.add_argument("--log-json", default=None, help="write the per-epoch records here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    args.buckets = tuple(sorted(int(b) for b in args.buckets.split(",")))
    if args.mirror == "budget" and args.budget is None:
        p.error("--mirror budget needs --budget SIZE, e.g. --budget 200MB")
    return args


def load_text(args):
    if args.synthetic:
        sents = synthetic_corpus(args.synthetic_sentences, args.synthetic_vocab, args.seed)
        cut = max(1, len(sents) // 10)
        return sents[cut:], sents[:cut]
    d = Path(args.data_dir)
    missing = [n for n in ("ptb.train.txt", "ptb.valid.txt") if not (d / n).exists()]
    if missing:
        raise SystemExit(f"train_ptb: error: {', '.join(missing)} not found in {d}")
    return read_sentences(d / "ptb.train.txt"), read_sentences(d / "ptb.valid.txt")


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)

    train_s, valid_s = load_text(args)
    vocab = build_vocab(train_s)
    train_ids, valid_ids = encode(train_s, vocab), encode(valid_s, vocab)
    sym_gen = Planner(args, len(vocab))
    if args.bucketing:
        train, valid = bucket_iter(train_ids, args), bucket_iter(valid_ids, args)
        mod = mx.mod.BucketingModule(sym_gen, default_bucket_key=train.default_bucket_key,
                                     context=mx.cpu())
        words_per_batch = None
    else:
        flat = lambda ss: [w for s in ss for w in s]  # noqa: E731
        train = StreamIter(flat(train_ids), args.batch_size, args.seq_len)
        valid = StreamIter(flat(valid_ids), min(args.batch_size, 4), args.seq_len) \
            if len(flat(valid_ids)) > 4 * args.seq_len else None
        symbol, data_names, label_names = sym_gen(args.seq_len)
        mod = mx.mod.Module(symbol, data_names=data_names, label_names=label_names,
                            context=mx.cpu())
        words_per_batch = args.batch_size * args.seq_len
    mod.bind(data_shapes=train.provide_data, label_shapes=train.provide_label)
    mod.init_params(initializer=mx.init.Xavier(factor_type="in", magnitude=2.34))
    mod.init_optimizer(optimizer=args.optimizer, optimizer_params={
        "learning_rate": args.lr, "wd": args.wd, "clip_gradient": args.clip,
        "rescale_grad": 1.0 / args.batch_size})
    default = sym_gen.plans[train.default_bucket_key]
    print(f"vocab {len(vocab)}, plan {default.policy} for length {train.default_bucket_key}: "
          f"predicted {default.planned_mb:.1f} MB (unplanned {default.baseline_mb:.1f} MB), "
          f"{len(default.recomputed_ids)} nodes recomputed", flush=True)
    mxnet_mb = mxnet_planned_mb(mod)

    records = []
    for epoch in range(args.epochs):
        train.reset()
        metric = mx.metric.Perplexity(ignore_label=PAD_ID)
        words = batches = 0
        start = time.perf_counter()
        total = getattr(train, "num_batches", None) if not args.bucketing else len(train.idx)
        if args.num_batches is not None:
            total = min(total, args.num_batches) if total else args.num_batches
        bar = tqdm(train, total=total, desc=f"epoch {epoch}", unit="batch",
                   disable=args.no_progress, dynamic_ncols=True)
        for batch in bar:
            if args.num_batches is not None and batches >= args.num_batches:
                break
            mod.forward_backward(batch)
            mod.update()
            mod.update_metric(metric, batch.label)
            batches += 1
            if words_per_batch is not None:
                words += words_per_batch
            else:
                words += int((batch.label[0].asnumpy() != PAD_ID).sum())
            bar.set_postfix(ppl=f"{metric.get()[1]:.1f}",
                            wps=f"{words / (time.perf_counter() - start):.0f}")
        bar.close()
        seconds = time.perf_counter() - start
        rec = {"epoch": epoch, "batches": batches, "words": words,
               "seconds": round(seconds, 3),
               "words_per_second": round(words / seconds, 1) if seconds else 0.0,
               "train_perplexity": float(metric.get()[1]),
               "policy": args.mirror, "bucketing": args.bucketing,
               "predicted_mb": {k: round(p.planned_mb, 2) for k, p in
                                sorted(sym_gen.plans.items())},
               "unplanned_mb": {k: round(p.baseline_mb, 2) for k, p in
                                sorted(sym_gen.plans.items())},
               "mxnet_mb": mxnet_mb,
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                    / 1024, 1)}
        if valid is not None:
            rec["valid_perplexity"] = perplexity(mod, valid, args.num_batches)
        if args.model_prefix:
            Path(args.model_prefix).parent.mkdir(parents=True, exist_ok=True)
            mod.save_checkpoint(args.model_prefix, epoch + 1)
            rec["checkpoint"] = f"{args.model_prefix}-{epoch + 1:04d}.params"
        records.append(rec)
        vp = rec.get("valid_perplexity")
        print(f"epoch {epoch}: train ppl {rec['train_perplexity']:.1f}"
              + (f", valid ppl {vp:.1f}" if vp is not None else "")
              + f", {rec['words_per_second']:.0f} words/s, planned "
              f"{default.planned_mb:.1f} MB (MXNet {mxnet_mb} MB), peak RSS "
              f"{rec['peak_rss_mb']:.0f} MB", flush=True)
        if not all(math.isfinite(v) for v in (rec["train_perplexity"], vp or 0.0)):
            print("train_ptb: warning: perplexity is not finite (lower --lr?)", flush=True)
    if args.log_json:
        Path(args.log_json).write_text(json.dumps(records, indent=1))
    return records


if __name__ == "__main__":
    main()
