"""A deep, narrow chain of conv-BN-ReLU blocks: the network where recursion pays.

Every block's output is the only value crossing it, the activations are small and
the blocks many, so the segmented executor's fixed costs (its pool is one block's
training graph) are far below what one recomputation per node can reach. Global
pooling before the classifier lets one parameter set serve any image size (a
BucketingModule bucketed by image size).
"""

from __future__ import annotations

import mxnet as mx


def conv_chain(blocks: int = 32, channels: int = 8, num_classes: int = 10,
               batchnorm: bool = True) -> mx.sym.Symbol:
    """Without BatchNorm, data-parallel training computes what one process does."""
    x = mx.sym.var("data")
    for i in range(blocks):
        x = mx.sym.Convolution(x, num_filter=channels, kernel=(3, 3), pad=(1, 1),
                               name=f"conv{i}")
        if batchnorm:
            x = mx.sym.BatchNorm(x, fix_gamma=False, name=f"bn{i}")
        x = mx.sym.Activation(x, act_type="relu", name=f"relu{i}")
    x = mx.sym.Pooling(x, global_pool=True, pool_type="avg", kernel=(1, 1), name="pool")
    x = mx.sym.FullyConnected(mx.sym.flatten(x), num_hidden=num_classes, name="fc")
    return mx.sym.SoftmaxOutput(x, name="softmax")
