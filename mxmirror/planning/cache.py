"""Plans kept on disk, so that a restarted job or every bucket of a BucketingModule plans once.

One JSON file per plan under ``<cache root>/plans`` (the root is ``cache_path()``, which
the templates the MXNet side learns share:
``MXMIRROR_CACHE=DIR`` or ~/.cache/mxmirror; ``MXMIRROR_CACHE=off`` keeps nothing). The
file name is a digest of everything that decides the plan: the symbol without mirror
attributes, shapes, dtypes, grad_req, the strategy and budget, the MXNet version and MKLDNN
switch (they decide the learned templates), a schema number and the source of the whole
package (any code change plans again). A file holds what the strategy chose, enough to
rebuild the Plan without searching: the recomputed node ids, checkpoints and bytes (the
resident arrays' too), and for segmented plans the cuts, tree, each template's simulated
memory and the plan's description (``segments.make_segment_plan`` rebuilds the rest when the
plan is bound: reading a plan needs no graph).
Files are written atomically (a unique temporary name, then a rename); a file that cannot
be read is reported once and planned again.
The folder is bounded: after each write, the least recently used files (by modification
time, which a read refreshes) beyond ``MAX_FILES`` files or ``MAX_BYTES`` bytes are deleted.
Another process may be pruning or writing at the same time: a file gone by the time it is
read or deleted is skipped (a reader plans again), and only whole ``*.json`` files are
pruned, never another process's temporary file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from mxmirror.ir.graph import BindInputs
from mxmirror.planning.analysis import Analysis, Score
from mxmirror.planning.choice import Choice, Decision
from mxmirror.segments.cost import SegmentPlan, make_segment_plan
from mxmirror.segments.cuts import build_segments
from mxmirror.segments.model import Segments

SCHEMA = 5  # bump when what a file holds changes
MAX_FILES = 1000  # plans kept at most (least recently used ones go first)
MAX_BYTES = 256 * 2**20  # bytes of plan files kept at most


@lru_cache(maxsize=1)
def source_digest() -> str:
    """Digest of the package's source (Python and the compiled planner's C): a plan is only
    reused by the code that made it."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for f in sorted([*root.rglob("*.py"), *root.rglob("*.c")]):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def plan_key(strategy: str, budget_bytes: int | None, source_json: str | None,
             inputs: BindInputs | None, never_worse: bool = True,
             learned_by: dict[str, str] | None = None) -> str | None:
    """The digest naming a plan's file; None when plans are not kept (no symbol, cache off).
    `learned_by`: what decided the learned templates (the MXNet version, MKL-DNN switch)."""
    if source_json is None or inputs is None or plans_dir() is None:
        return None
    parts = {
        "schema": SCHEMA, "source": source_digest(), **(learned_by or {}),
        "symbol": source_json,
        "shapes": {k: list(v) for k, v in sorted(inputs.shapes.items())},
        "type_dict": sorted((k, _dtype_name(v)) for k, v in (inputs.type_dict or {}).items()),
        "grad_req": sorted(inputs.grad_req.items()),
        "strategy": strategy, "budget": budget_bytes, "never_worse": never_worse,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _dtype_name(dtype: object) -> str:
    """'float32' for 'float32', np.float32 or np.dtype('float32') (Module passes types)."""
    try:
        import numpy as np

        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def plans_dir() -> Path | None:
    """Where plans are kept (None: ``MXMIRROR_CACHE=off``)."""
    root = cache_path()
    return None if root is None else root / "plans"


def _file(key: str) -> Path | None:
    folder = plans_dir()
    return None if folder is None else folder / f"{key}.json"


def load(key: str | None, analysis: Callable[[], Analysis], nodes: int) -> Decision | None:
    """The decision kept for `key`, or None (not kept, or unreadable:
    warned once, and the caller plans again and overwrites it). `nodes`: the graph's node
    count; `analysis` is asked for only when a segmented plan is rebuilt."""
    file = _file(key) if key else None
    if file is None:
        return None
    try:
        text = read_kept(file)
        return None if text is None else _from_record(json.loads(text), analysis, nodes)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        warnings.warn(f"mxmirror: ignoring an unreadable plan cache file {file.name} "
                      f"({type(exc).__name__}: {exc}); planning again", stacklevel=3)
        return None


def save(key: str | None, decision: Decision) -> None:
    """Keep a plan for `key` (nothing when the cache is off; a read-only cache is fine)."""
    file = _file(key) if key else None
    if file is not None:
        keep(file, json.dumps(_to_record(decision)))


def read_kept(file: Path) -> str | None:
    """The text of a kept file (a plan, a symbol as MXNet read it), marked recently used so
    that it is pruned last; None where it is not kept (or another process pruned it)."""
    try:
        text = file.read_text()
    except FileNotFoundError:
        return None
    with contextlib.suppress(OSError):
        os.utime(file)
    return text


def keep(file: Path, text: str) -> None:
    """Keep `text` in `file` and bound its folder (prune); a read-only cache keeps nothing."""
    try:
        write_atomic(file, text)
        prune(file.parent)
    except OSError:
        pass


def prune(folder: Path, max_files: int | None = None, max_bytes: int | None = None) -> None:
    """Delete the least recently used plan files beyond `max_files` files or `max_bytes`
    bytes (default MAX_FILES, MAX_BYTES); files that vanish meanwhile are skipped."""
    max_files = MAX_FILES if max_files is None else max_files
    max_bytes = MAX_BYTES if max_bytes is None else max_bytes
    kept = []
    for f in folder.glob("*.json"):
        with contextlib.suppress(OSError):
            st = f.stat()
            kept.append((st.st_mtime, st.st_size, f))
    kept.sort(key=lambda t: t[0], reverse=True)  # newest first
    total = 0
    for i, (_, size, f) in enumerate(kept):
        total += size
        if i and (i >= max_files or total > max_bytes):  # the newest file always stays
            with contextlib.suppress(OSError):
                f.unlink()


def _to_record(decision: Decision) -> dict:
    choice, s = decision.choice, decision.choice.score
    rec = {"schema": SCHEMA, "mirror": sorted(s.recomputed_ids), "planned_bytes": s.planned_bytes,
           "recompute_ratio": s.recompute_ratio, "checkpoints": list(choice.checkpoints),
           "choice_notes": list(choice.notes), "baseline_bytes": decision.baseline_bytes,
           "notes": list(decision.notes), "resident_bytes": list(decision.resident_bytes),
           "baseline_blocks": list(decision.baseline_blocks),
           "planned_blocks": list(decision.planned_blocks), "segments": None}
    if choice.segments is not None:
        sp = choice.segments
        keys = _template_keys(sp.segments)
        rec["segments"] = {"cuts": list(sp.cuts),
                           "tree": [[s, e, mid] for (s, e), mid in sorted(sp.tree.items())],
                           "template_bytes": [sp.template_bytes[k] for k in keys],
                           "template_blocks": [sp.template_blocks[k] for k in keys],
                           "described": sp.describe()}
    return rec


def _template_keys(sg: Segments) -> list[str]:
    """The segments' template keys, in order of first use (how a file lists their memory:
    the simulated training graph of each template is the costly part of a rebuild)."""
    return list(dict.fromkeys(seg.key for seg in sg.segments))


def _from_record(rec: dict, analysis: Callable[[], Analysis], nodes: int) -> Decision:
    if rec["schema"] != SCHEMA:
        raise ValueError(f"schema {rec['schema']}, expected {SCHEMA}")
    mirror = frozenset(int(i) for i in rec["mirror"])
    if any(not 0 <= i < nodes for i in mirror):
        raise ValueError("node ids outside the graph")
    score = Score(int(rec["planned_bytes"]), float(rec["recompute_ratio"]), mirror)
    segments = None
    if rec["segments"] is not None:
        seg = rec["segments"]
        kept = ([int(c) for c in seg["cuts"]],
                {(int(s), int(e)): int(mid) for s, e, mid in seg["tree"]},
                [int(b) for b in seg["template_bytes"]],
                [[int(b) for b in bl] for bl in seg["template_blocks"]])
        if any(not 0 <= c < nodes for c in kept[0]) or len(kept[2]) != len(kept[3]):
            raise ValueError("cuts outside the graph, or template figures that disagree")
        segments = KeptSegments(lambda: _rebuilt(analysis().graph, *kept, score.planned_bytes),
                                dict(seg["described"]))
    choice = Choice(score, tuple(rec["checkpoints"]), segments, tuple(rec["choice_notes"]))
    args, grads, aux = (int(b) for b in rec["resident_bytes"])
    return Decision(choice, int(rec["baseline_bytes"]), tuple(str(x) for x in rec["notes"]),
                    (args, grads, aux), tuple(int(b) for b in rec["baseline_blocks"]),
                    tuple(int(b) for b in rec["planned_blocks"]))


class KeptSegments:
    """A segmented plan read from disk: its description at once, the SegmentPlan itself
    (every attribute) rebuilt from the graph on first use, as binding it needs."""

    def __init__(self, rebuild: Callable[[], SegmentPlan], described: dict) -> None:
        self._rebuild, self._described, self._plan = rebuild, described, None

    def describe(self) -> dict:
        return dict(self._described)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._resolved(), name)

    def __reduce__(self) -> tuple:
        """Pickled as the SegmentPlan itself (the child that measures a plan gets one)."""
        return (_as_is, (self._resolved(),))

    def _resolved(self) -> SegmentPlan:
        if self._plan is None:
            self._plan = self._rebuild()
        return self._plan


def _as_is(value: Any) -> Any:
    return value


def _rebuilt(graph, cuts: list[int], tree: dict, template_bytes: list[int],
             template_blocks: list[list[int]], planned_bytes: int) -> SegmentPlan:
    """The segment plan of a file's cuts and tree, its templates' memory as the file keeps it
    (their simulated training graphs are the costly part of a rebuild)."""
    sg = build_segments(graph, cuts)
    keys = _template_keys(sg)
    if len(keys) != len(template_bytes):
        raise ValueError("the segments rebuilt differ from the ones kept")
    mem = (dict(zip(keys, template_bytes)), dict(zip(keys, template_blocks)))
    plan = make_segment_plan(graph, sg.cuts, tree, sg=sg, mem=mem)
    if plan.planned_bytes != planned_bytes:
        raise ValueError("the segment plan rebuilt differs from the one kept")
    return plan


TEMPLATES = "templates-mxnet-{}"  # the templates learned from one MXNet version, a file per op


def templates_dir(mxnet_version: str) -> Path | None:
    """Where the templates learned from this MXNet version are kept (None: cache off)."""
    root = cache_path()
    return None if root is None else root / TEMPLATES.format(mxnet_version)


def templates_kept() -> bool:
    """Whether any template is kept (or the cache is off): False on a new user's first run."""
    root = cache_path()
    return root is None or any(root.glob(TEMPLATES.format("*") + "/*.json"))


def cache_path() -> Path | None:
    """The root of every disk cache (templates, plans): ``MXMIRROR_CACHE`` or
    ~/.cache/mxmirror; None when ``MXMIRROR_CACHE=off`` (nothing read or written)."""
    base = os.environ.get("MXMIRROR_CACHE")
    if base is not None and base.strip().lower() == "off":
        return None
    base = base or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mxmirror")
    return Path(base)


def write_atomic(file: Path, text: str) -> None:
    """Write through a temporary file of a unique name, then rename: a concurrent reader
    sees the old file or the new one, never half of one (OSError: not written)."""
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=file.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
