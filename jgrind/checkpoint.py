"""Orbax checkpoints of a training run: parameters, optimizer state, best-so-far and the log;
and a run's final parameters alone (`save_params` / `restore_params`).

Resuming restores the exact state at the saved epoch; together with keys derived by
``fold_in(key, epoch)`` this makes a resumed run end with the same parameters as one that never
stopped.

Orbax verifies no checksum when it restores, so a flipped bit in a checkpoint's data comes back
as other parameters (or as NaN, or a TensorStore error). Every checkpoint therefore records a
SHA-256 digest of its arrays and of its meta (`digest`), checked after restoring: a damaged
step is moved aside (``N.damaged``) with a warning and the next older one is resumed.

Saves are synchronous and run whole (`jgrind.interrupts.deferred`): a Ctrl-C waits for the
step to be written rather than leave a half-written ``N.orbax-checkpoint-tmp`` folder, and a
save that fails (a full disk) raises here, with its partial step removed, instead of in a
background thread.

A run of several processes (`jgrind.devices.processes`) has one writer: process 0. Its
parameters and optimizer state are replicated over every device, so one copy is the whole
state: process 0 saves it, as one device's copy (`_local_copy`), into its own folder, and on
resume reads it there and sends it to the others, byte for byte, through a JAX collective
(`_from_process_zero`). No folder is shared between the processes (orbax's multi-process
checkpoints would need one on every host), and a resumed run restores the exact state on any
number of devices.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import pathlib
import re
import shutil
import sys
import time
import warnings
from typing import Any, Optional

import orbax.checkpoint as ocp

from jgrind import interrupts
from jgrind.broadcast import broadcast_bytes

DAMAGED = ".damaged"  # the suffix of a step folder moved aside because its digest differs


class CheckpointMismatch(ValueError):
    """A checkpoint that this run must not resume: another model, graph or selection rule, or
    an epoch past the run's end. The message says which and what to do."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written (its disk is full) or read back intact (every saved
    step is damaged). The message names the folder and what to do."""


def graph_differences(saved: dict, current: dict) -> list[str]:
    """What differs between two `jgrind.Graph.fingerprint` records, in words (empty if
    nothing does)."""
    sizes = [k for k in ("nodes", "edges", "features", "classes", "multilabel")
             if saved.get(k) != current.get(k)]
    if sizes:
        return [f"{k} {saved.get(k)} -> {current.get(k)}" for k in sizes]
    return [f"its {k.removesuffix('_crc')} differ" for k in ("edges_crc", "features_crc",
                                                              "labels_crc", "masks_crc")
            if saved.get(k) != current.get(k)]


def manager(directory: str | pathlib.Path, every: int, keep: int = 2) -> ocp.CheckpointManager:
    directory = pathlib.Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    remove_partial(directory)  # the half-written step of a process killed outright (SIGKILL)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=max(every, 1),
                                           enable_async_checkpointing=False,
                                           **_this_process_only())
    return ocp.CheckpointManager(directory, options=options)


def _this_process_only() -> dict:
    """Orbax's options for a checkpoint this process writes and reads alone: none in a run
    of one process. In a run of several (`jgrind.devices.processes`) each keeps its own
    folder, so orbax must not wait at its barriers for the others, which never write there
    (and, so told, it leaves making the folder to the caller)."""
    import jax
    if jax.process_count() == 1:
        return {}
    me = jax.process_index()
    return {"create": False, "multiprocessing_options": ocp.options.MultiprocessingOptions(
        primary_host=me, active_processes={me})}


def _local_copy(state: Any) -> Any:
    """``state`` with every array placed on several devices (a parameter replicated over the
    devices of a run on several, `jgrind.devices`, in this process or across several) replaced
    by one copy, as a NumPy array: saved with its placement, it could be restored only on the
    same devices. ValueError for an array split over processes (no process holds it whole)."""
    import jax
    import numpy as np

    several = jax.process_count() > 1

    def one(a):
        if not isinstance(a, jax.Array):
            return a
        if len(a.sharding.device_set) == 1:
            # in a run of several processes, this process's own copy (the out-of-core
            # engine's, `jgrind.devices.ShardedOutOfCore`): orbax refuses a process-local array
            return np.asarray(a) if several else a
        if a.is_fully_replicated:
            return np.asarray(a.addressable_data(0))
        if a.is_fully_addressable:
            return np.asarray(a)
        raise ValueError(f"an array of shape {a.shape} is split over several processes "
                         f"({a.sharding}); a checkpoint holds replicated state only")
    return jax.tree.map(one, state)


def _writes() -> bool:
    """Whether this process writes the run's checkpoints: the only one, or process 0 of
    several."""
    import jax
    return jax.process_index() == 0


def layout(state: Any) -> list:
    """The shape of every array in ``state``, in tree order: what a checkpoint must match to be
    restored into it."""
    import jax
    return [list(getattr(leaf, "shape", ())) for leaf in jax.tree.leaves(state)]


def digest(state: Any = None, meta: Optional[dict] = None) -> str:
    """SHA-256 of every array of ``state`` (dtype, shape and bytes, in tree order), or of
    ``meta`` as JSON: what a checkpoint records of itself, to tell a damaged one on restore."""
    import jax
    import numpy as np
    h = hashlib.sha256()
    if meta is not None:
        h.update(json.dumps(meta, sort_keys=True).encode())
    for leaf in jax.tree.leaves(jax.device_get(state)):
        leaf = np.ascontiguousarray(leaf)
        h.update(f"{leaf.dtype}{leaf.shape}".encode())
        h.update(leaf.tobytes())
    return h.hexdigest()


def save(mgr: ocp.CheckpointManager, epoch: int, state: Any, meta: dict, force=False) -> None:
    """Write ``state`` and ``meta`` as step ``epoch`` (if ``force``, or the manager's
    interval says so), whole: a signal meanwhile waits for the end (`interrupts.deferred`).
    `CheckpointError` if the disk is full, with nothing of the step left."""
    if not _writes():  # one of several processes: process 0 writes the one copy
        return
    if not force and not mgr.should_save(epoch):
        return
    state = _local_copy(state)
    meta = {**meta, "layout": layout(state)}
    meta["checksum"] = {"meta": digest(meta=meta), "state": digest(state)}
    with interrupts.deferred(), _quiet_orbax():
        try:
            mgr.save(epoch, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    meta=ocp.args.JsonSave(meta)), force=force)
        except Exception as err:  # orbax and TensorStore wrap the OS error in their own types
            remove_partial(mgr.directory, settle_s=_SETTLE_S)
            full = disk_full(err)
            if full is None:
                raise
            raise CheckpointError(f"the disk of the output folder {mgr.directory} is full "
                                  f"({full}) while saving the checkpoint of epoch {epoch}; "
                                  "free space there, or choose another folder (--out)") from None


@contextlib.contextmanager
def _quiet_orbax():
    """Orbax's own log of a failed read or write (a traceback per array, through absl's
    logger) silenced: the failure reaches the caller as one exception, said in one line.
    And TensorStore's reads and writes still running when orbax's event loop stopped on the
    first failure end in "Event loop is closed" (unraisable, printed as tracebacks) or in
    asyncio's "Task exception was never retrieved": dropped (`_OrbaxTaskErrors`)."""
    _drop_late_callbacks()
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


_LATE = ("Event loop is closed", "cannot schedule new futures after shutdown")


class _OrbaxTaskErrors(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" for orbax's own write tasks: after
    the first write of a failed save, its sibling writes fail too (the same full disk) and are
    logged when the garbage collector finds them, however late; the save's failure has already
    been said in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith("Task exception was never retrieved") and "orbax" in text)


def _drop_late_callbacks() -> None:
    tasks = logging.getLogger("asyncio")
    if not any(isinstance(f, _OrbaxTaskErrors) for f in tasks.filters):
        tasks.addFilter(_OrbaxTaskErrors())
    hook = sys.unraisablehook
    if getattr(hook, "drops_late_callbacks", False):
        return

    def hook_dropping_late_callbacks(unraisable):
        if isinstance(unraisable.exc_value, RuntimeError) \
                and str(unraisable.exc_value) in _LATE:
            return
        hook(unraisable)
    hook_dropping_late_callbacks.drops_late_callbacks = True
    sys.unraisablehook = hook_dropping_late_callbacks


# After a failed save, how long no temporary folder may reappear before it is taken as gone
_SETTLE_S = 1.0


def remove_partial(directory: str | pathlib.Path, settle_s: float = 0.0) -> None:
    """Remove the temporary folders of steps whose save did not finish.

    With ``settle_s``, keep removing them until none has reappeared for that long (at most
    ten times as long in all): a save that failed stopped at its first failed write while
    TensorStore's other writes of the step were still running on its own threads, and those
    recreate the folders they write into, after or during a first removal."""
    root = pathlib.Path(directory)
    start = last_seen = time.monotonic()
    while True:
        partial = list(root.glob("*.orbax-checkpoint-tmp*"))
        for folder in partial:
            shutil.rmtree(folder, ignore_errors=True)
        now = time.monotonic()
        if partial:
            last_seen = now
        if now - last_seen >= settle_s or now - start >= 10 * settle_s:
            return
        time.sleep(settle_s / 10)


_FULL = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
         errno.EFBIG: "file too large"}


def disk_full(err: BaseException) -> Optional[str]:
    """Why ``err`` (or an error it wraps) says a write found no room, in words, or None.
    TensorStore says it only in its message (``RESOURCE_EXHAUSTED``, ``os_error_code='28'``)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _FULL:
            return _FULL[err.errno]
        text = str(err)
        code = re.search(r"os_error_code='?(\d+)", text)
        if code and int(code.group(1)) in _FULL:
            return _FULL[int(code.group(1))]
        if "No space left" in text or ("RESOURCE_EXHAUSTED" in text and "writ" in text):
            return _FULL[errno.ENOSPC]  # (not XLA's RESOURCE_EXHAUSTED: out of device memory)
        err = err.__cause__ or err.__context__
    return None


def restore_latest(mgr: ocp.CheckpointManager, like: Any,
                   graph: Optional[dict] = None) -> Optional[tuple[int, Any, dict]]:
    """``(epoch, state, meta)`` of the latest checkpoint, or None. ``like`` gives the pytree
    structure (e.g. freshly initialised state). `CheckpointMismatch`, before any array is
    read, if the checkpoint was trained on another graph than ``graph`` (a
    `jgrind.Graph.fingerprint`; checked first, since another graph's sizes would also give
    other shapes), or holds other shapes (another model or optimizer): orbax's own errors for
    that are pages long. A checkpoint that records no graph (an older jgrind's) is resumed
    with a warning.

    A step whose arrays or meta differ from the digest it recorded (`digest`), or that
    orbax cannot read, is moved aside (``N.damaged``) with one warning, and the next older
    step is tried: a run resumes from its newest intact checkpoint. `CheckpointError` if
    every step is damaged.

    In a run of several processes, process 0 reads its own folder and sends the others what
    it found (`_from_process_zero`): the same state, or the same error, in every process;
    the others' ``mgr`` is not read."""
    import jax
    if jax.process_count() > 1:
        return _from_process_zero(mgr, like, graph)
    return _restore_latest_here(mgr, like, graph)


def _restore_latest_here(mgr: ocp.CheckpointManager, like: Any,
                         graph: Optional[dict]) -> Optional[tuple[int, Any, dict]]:
    """`restore_latest` from ``mgr``'s folder, in this process alone."""
    damaged = []
    for step in sorted(mgr.all_steps(), reverse=True):
        try:
            meta = _verified(mgr, step, meta=True)
        except _Damaged as err:
            damaged.append((step, str(err)))
            continue
        _check_resumable(mgr, step, meta, like, graph)
        try:
            restored = _verified(mgr, step, like=like, meta=False)
        except _Damaged as err:
            damaged.append((step, str(err)))
            continue
        _set_aside(mgr, damaged, f"resuming from epoch {step}")
        return step, restored, meta
    if damaged:
        raise CheckpointError(f"every checkpoint in {mgr.directory} is damaged ("
                              + "; ".join(f"epoch {s}: {why}" for s, why in damaged)
                              + "); remove them to start afresh, or restore the folder "
                              "from a backup")
    return None


_SENT_ERRORS = {"CheckpointMismatch": CheckpointMismatch, "CheckpointError": CheckpointError}


def _from_process_zero(mgr: ocp.CheckpointManager, like: Any,
                       graph: Optional[dict]) -> Optional[tuple[int, Any, dict]]:
    """`restore_latest` in a run of several processes: process 0 restores from its folder
    and broadcasts a header (JSON: the epoch, the meta and the arrays' dtypes and shapes, or
    the error it raised), then the arrays' bytes; every process returns the same ``(epoch,
    state, meta)`` or raises the same error. Bytes, not values: `broadcast_one_to_all` sums
    the source's values with the others' zeros, which would turn -0.0 into 0.0."""
    import jax
    import numpy as np
    if not _writes():
        return _received(like)
    try:
        found = _restore_latest_here(mgr, _local_copy(like), graph)
    except (CheckpointMismatch, CheckpointError) as err:
        _broadcast_bytes(json.dumps({"error": type(err).__name__,
                                     "message": str(err)}).encode())
        raise
    except Exception:  # (not an interrupt: the others are stopping too, and would not answer)
        _broadcast_bytes(json.dumps({"error": "failed"}).encode())
        raise
    if found is None:
        _broadcast_bytes(json.dumps({"epoch": None}).encode())
        return None
    epoch, state, meta = found
    # each array's own shape (`tobytes` writes C order whatever the layout): given [1] for
    # a 0-d array (Adam's step count, as `np.ascontiguousarray` makes it), the others'
    # optimizer update computes its bias correction at shape [1], another program, whose
    # last bits differ from process 0's
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(state)]
    _broadcast_bytes(json.dumps({"epoch": epoch, "meta": meta, "leaves": [
        [leaf.dtype.name, list(leaf.shape)] for leaf in leaves]}).encode())
    _broadcast_bytes(b"".join(leaf.tobytes() for leaf in leaves))
    return found


def _received(like: Any) -> Optional[tuple[int, Any, dict]]:
    """What process 0 sends in `_from_process_zero`, in another process: checked against the
    digest the checkpoint recorded."""
    import jax
    import numpy as np
    header = json.loads(_broadcast_bytes(None).decode())
    if "error" in header:
        kind = _SENT_ERRORS.get(header["error"])
        if kind is not None:
            raise kind(header["message"])
        raise CheckpointError("process 0 failed while reading the checkpoint in its output "
                              "folder (its own output says why)")
    if header["epoch"] is None:
        return None
    data = _broadcast_bytes(None)
    arrays, at = [], 0
    for name, shape in header["leaves"]:
        dtype = _dtype(name)
        count = int(np.prod(shape, dtype=np.int64))
        arrays.append(np.frombuffer(data, dtype, count=count, offset=at).reshape(shape).copy())
        at += count * dtype.itemsize
    got, own = [list(a.shape) for a in arrays], layout(like)
    if got != own:  # (process 0 checked the checkpoint against its own state's shapes)
        at = next((i for i, (g, o) in enumerate(zip(got, own)) if g != o), min(len(got),
                                                                              len(own)))
        raise CheckpointError(
            f"process {jax.process_index()} received from process 0 a state of other shapes "
            f"than its own (array {at}: shape {got[at] if at < len(got) else 'none'}, here "
            f"{own[at] if at < len(own) else 'none'}); run every process with the same "
            "jgrind, model and optimizer")
    state = jax.tree.unflatten(jax.tree.structure(like), arrays)
    meta = header["meta"]
    record = meta.get("checksum")
    if record is not None and record.get("state") != digest(state):
        raise CheckpointError(f"process {jax.process_index()} received other arrays from "
                              f"process 0 than its checkpoint of epoch {header['epoch']} "
                              "holds: a fault in the collectives; run again")
    return header["epoch"], state, meta


def _dtype(name: str):
    """The NumPy dtype named ``name``, bfloat16 and JAX's other ml_dtypes included."""
    import numpy as np
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name))


def _broadcast_bytes(data: Optional[bytes]) -> bytes:
    """Process 0's ``data`` in every process (`jgrind.broadcast.broadcast_bytes`)."""
    return broadcast_bytes(data)


class _Damaged(Exception):
    """A checkpoint step that cannot be read back as it was saved (the reason)."""


def _verified(mgr: ocp.CheckpointManager, step: int, like: Any = None, meta: bool = True):
    """Step ``step``'s meta (``meta``), or its state shaped like ``like``, checked against the
    digest its meta records; `_Damaged` if it differs or orbax fails to read it."""
    try:
        with _quiet_orbax():
            saved = mgr.restore(step, args=ocp.args.Composite(
                meta=ocp.args.JsonRestore()))["meta"]
        record = saved.get("checksum") if isinstance(saved, dict) else None
        if record is not None and record.get("meta") != digest(
                meta={k: v for k, v in saved.items() if k != "checksum"}):
            raise _Damaged("its meta differs from its checksum")
        if meta:
            return saved
        with _quiet_orbax():
            state = mgr.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(like)))["state"]
    except _Damaged:
        raise
    except Exception as err:  # whatever orbax, TensorStore or JSON raise on damaged files
        lines = str(err).strip().splitlines()
        raise _Damaged(f"cannot be read: {type(err).__name__}: "
                       f"{lines[0][:200] if lines else ''}") from None
    if record is not None and record.get("state") != digest(state):
        raise _Damaged("its arrays differ from their checksum")
    return state


def _check_resumable(mgr, step: int, meta: dict, like: Any, graph: Optional[dict]) -> None:
    """`CheckpointMismatch` if step ``step`` is of another graph or of other shapes."""
    if graph is not None and "graph" not in meta:
        warnings.warn(f"the checkpoint in {mgr.directory} was saved by an older jgrind and "
                      "records no fingerprint of its graph, so resuming cannot check that the "
                      "graph is the same (OGB folders of ogbn-products and ogbn-proteins now "
                      "load undirected, as OGB's own loaders do)", stacklevel=4)
    differ = graph_differences(meta["graph"], graph) if graph is not None and "graph" in meta \
        else []
    if differ:
        raise CheckpointMismatch(f"the checkpoint in {mgr.directory} was trained on another "
                                 f"graph ({'; '.join(differ)}); resume it on the graph "
                                 "it was trained on, or use a new checkpoint directory")
    saved = meta.get("layout")
    if saved is not None and saved != layout(like):
        raise CheckpointMismatch(f"the checkpoint in {mgr.directory} (epoch {step}) was saved "
                                 "for another model or optimizer: its arrays have other shapes "
                                 "than this run's; use a new checkpoint directory, or the "
                                 "model it was saved for")


def _set_aside(mgr: ocp.CheckpointManager, damaged: list, instead: str) -> None:
    """Move every damaged step's folder to ``N.damaged`` (kept to look at, out of the way of
    the step the run saves next), with one warning line each."""
    if not damaged:
        return
    for step, why in damaged:
        folder = pathlib.Path(mgr.directory) / str(step)
        aside, n = folder.with_name(f"{step}{DAMAGED}"), 1
        while aside.exists():
            n += 1
            aside = folder.with_name(f"{step}{DAMAGED}.{n}")
        folder.rename(aside)
        warnings.warn(f"the checkpoint {folder} is damaged ({why}); moved it to {aside.name} "
                      f"and {instead}", stacklevel=4)
    mgr.reload()


def save_params(directory: str | pathlib.Path, epoch: int, params: Any, best_params: Any,
                meta: dict) -> None:
    """A run's final parameters (and its best ones), without the optimizer state, in the layout
    `restore_params` reads: what ``jgrind train`` keeps in ``OUT/params/seed*``."""
    mgr = manager(directory, every=1, keep=1)
    try:
        save(mgr, epoch, _local_copy({"params": params, "best_params": best_params}), meta,
             force=True)
        mgr.wait_until_finished()
    finally:
        mgr.close()


def restore_params(directory: str | pathlib.Path, like: Any) -> Optional[tuple[Any, Any, dict]]:
    """``(params, best_params, meta)`` of the latest checkpoint in ``directory`` (None if there
    is none), as pytrees shaped like ``like`` (abstract arrays will do); ``meta`` gains the
    checkpoint's ``epoch``. The optimizer state is not needed. ValueError if the checkpoint's
    parameters have other shapes than ``like``'s; `CheckpointError` if they differ from their
    checksum."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    mgr = ocp.CheckpointManager(pathlib.Path(directory).absolute(),
                                options=ocp.CheckpointManagerOptions(
                                    **_this_process_only()))
    try:
        step = mgr.latest_step()
        if step is None:
            return None
        try:
            meta = _verified(mgr, step, meta=True)
            state = _verified(mgr, step, like=None, meta=False)
        except _Damaged as err:
            raise CheckpointError(f"the saved parameters in {directory} (epoch {step}) are "
                                  f"damaged: {err}; train the run again") from None
    finally:
        mgr.close()
    treedef, shapes = jax.tree.structure(like), layout(like)
    trees = []
    for name in ("params", "best_params"):
        leaves = jax.tree.leaves(state[name])
        if [list(np.shape(leaf)) for leaf in leaves] != shapes:
            raise ValueError(f"the checkpoint in {directory} (epoch {step}) was saved for "
                             f"another model: its {name} have the shapes "
                             f"{[list(np.shape(leaf)) for leaf in leaves]}, not {shapes}; pass "
                             "the model it was trained with")
        trees.append(jax.tree.unflatten(treedef, [jnp.asarray(leaf) for leaf in leaves]))
    return trees[0], trees[1], {**meta, "epoch": step}
