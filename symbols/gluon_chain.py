"""symbols/chain.py as a Gluon HybridBlock: where a segmented plan runs inside PlannedBlock.

A deep chain of small conv-BatchNorm-ReLU blocks: the recursive plan is below every
one-recompute plan here, so ``PlannedBlock(net, "recursive")`` binds the segmented executor.
A fixed prefix gives every instance the same Parameter names.
"""

from __future__ import annotations

from mxnet import gluon


class ConvChain(gluon.HybridBlock):
    """`blocks` conv-BN-ReLU blocks of `channels` channels, global average pooling and a
    classifier; Dropout(0.3) after the blocks listed in `dropout_after`."""

    def __init__(self, blocks: int = 32, channels: int = 8, classes: int = 10,
                 dropout_after: tuple[int, ...] = ()) -> None:
        super().__init__(prefix="chain_")
        with self.name_scope():
            self.body = gluon.nn.HybridSequential()
            for i in range(blocks):
                self.body.add(gluon.nn.Conv2D(channels, 3, padding=1), gluon.nn.BatchNorm(),
                              gluon.nn.Activation("relu"))
                if i in dropout_after:
                    self.body.add(gluon.nn.Dropout(0.3))
            self.body.add(gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(classes))

    def hybrid_forward(self, F, x):
        return self.body(x)
