"""The recycler of boundary arrays: reuse by shape, and never more held than its cap."""

from __future__ import annotations

import gc
import weakref

import mxnet as mx

from mxmirror.runtime.segmented.recycler import Recycler

KB4 = 4096  # bytes of a (1024,) float32 array


def test_reuses_a_dropped_array_of_its_shape() -> None:
    rec = Recycler(2 * KB4)
    new = rec.allocator(mx.nd.zeros((1024,)))
    a = new()
    a[:] = 7
    handle = a.handle.value
    del a
    b = new()
    assert b.handle.value == handle and rec.made == 1 and rec.handed == 2
    b[:] = 1  # written after the old value's reads, as the engine orders them
    assert b.asnumpy().sum() == 1024


def test_holds_no_more_than_its_cap() -> None:
    rec = Recycler(2 * KB4)
    small, large = rec.allocator(mx.nd.zeros((1024,))), rec.allocator(mx.nd.zeros((2048,)))
    arrays = [small(), small()]
    del arrays  # both wait: 8 KB held
    assert (rec.live_bytes, rec.free_bytes) == (0, 2 * KB4)
    big = large()  # needs the room: the waiting ones are freed
    assert (rec.live_bytes, rec.free_bytes, rec.peak_bytes) == (2 * KB4, 0, 2 * KB4)
    extra = small()  # beyond the cap (the plan's figure was wrong): allocated all the same
    del big  # ... and what comes back beyond the cap is freed
    assert (rec.live_bytes, rec.free_bytes) == (KB4, 0)
    del extra
    assert (rec.live_bytes, rec.free_bytes) == (0, KB4)
    assert rec.peak_bytes == 3 * KB4


def test_freed_with_its_last_array_not_by_the_collector() -> None:
    """A dropped executor's waiting handles go at once (rebinding for each bucket)."""
    gc.disable()
    try:
        rec = Recycler(KB4)
        new = rec.allocator(mx.nd.zeros((1024,)))
        kept = new()
        home = weakref.ref(rec)
        del rec, new
        assert home() is not None  # its array still returns there
        del kept
        assert home() is None
    finally:
        gc.enable()


def test_an_array_dropped_after_its_recycler_is_freed() -> None:
    """The collector may finalize a cycle holding a recycler and its arrays in any order
    (an exception's traceback holding an executor): an array dropped after its recycler
    was finalized frees its handle, where it raised a KeyError in __del__ (printed to the
    user's stderr as an ignored exception)."""
    import sys

    rec = Recycler(2 * KB4)
    a = rec.allocator(mx.nd.zeros((1024,)))()
    a[:] = 1
    rec.__del__()  # what the collector runs first in such a cycle
    raised = []
    hook, sys.unraisablehook = sys.unraisablehook, raised.append
    try:
        del a
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert not raised, [r.exc_value for r in raised]
    assert (rec.live_bytes, rec.free_bytes) == (0, 0)
