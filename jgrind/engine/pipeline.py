"""The loader and writer threads around a sweep's steps, and the order a sweep must keep.

While partition p's step runs, a loader thread reads partition p+1's inputs and hands them to
the device, and a writer thread stores partition p-1's outputs. JAX dispatch is asynchronous,
so the main thread only blocks where a value is needed.

A sweep's I/O is a `SweepIO` (`Pipeline.sweep`). Its contract, checked as it runs:

1. Iterate it once. It yields ``(part, input)`` for every partition, in the engine's order.
2. After each yield, register the step dispatched on that input with `SweepIO.dispatched`,
   exactly once, before asking for the next input. The load of partition i+1 waits for the
   step of partition i-1 (the last one registered), which bounds the inputs alive to two
   partitions' (the working-set model); a step left unregistered would break that bound
   silently, so it raises `PipelineError` instead.
3. Queue the step's stores with `SweepIO.write` (the stores of at most `MAX_PENDING_STEPS`
   steps wait behind the compute).
4. Leave the ``with`` block (or call `SweepIO.finish`): it waits for the queued writes and
   re-raises a writer's error on the main thread.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
from typing import Callable, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jgrind import interrupts
from jgrind.hostio import transfers
from jgrind.engine.store import DeviceRows

MAX_PENDING_STEPS = 1  # steps whose writes are queued behind the compute (`SweepIO.write`)
# Below this many bytes a piece, one transfer carries the whole array (`_put`)
MIN_PIECE_BYTES = 4 << 20


class PipelineError(RuntimeError):
    """A sweep's steps broke the order `SweepIO` relies on (a bug in the engine)."""


@dataclasses.dataclass
class TransferSettings:
    """How data crosses between host and device: set for the backend when the engine is
    built; tools change them between epochs (tools/trace_epoch.py --variants).

    Attributes:
      keep_device_rows: gathers and scatter-adds leave the rows held on the device there
        (`jgrind.engine.store.Table.gather`, ``accumulate``).
      pinned_host: where a step output the store reads on the host is copied to (page-locked
        memory), or None: the output itself, its host copy started early or not.
      early_host_copies: start such an output's host copy when its step is dispatched.
      staging_pieces: row ranges a large step input is sent to the device in, at once
        (`_put`).
      input_staging: the page-locked buffers the store fills step inputs into, when it has
        them (`jgrind.hostio.transfers.PinnedStaging`); an input in one of them is put from there.
    """

    keep_device_rows: bool
    pinned_host: Optional[jax.sharding.Sharding]
    early_host_copies: bool = True
    staging_pieces: int = 1
    input_staging: Optional[transfers.PinnedStaging] = None

    @property
    def pinned_inputs(self) -> bool:
        """Whether step inputs are filled into page-locked buffers (`input_staging`)."""
        return self.input_staging is not None and self.input_staging.enabled

    @pinned_inputs.setter
    def pinned_inputs(self, on: bool) -> None:
        if on and self.input_staging is None:
            raise ValueError("this engine's store has no page-locked input buffers (its "
                             "backend has no pinned_host memory)")
        if self.input_staging is not None:
            self.input_staging.enabled = bool(on)


class Pipeline:
    """The loader pool (two threads) and the writer (one thread) every sweep shares, or none
    without ``prefetch``: then each load and write runs on the main thread, in order.

    ``count`` is `jgrind.engine.store.Store.count` (the bytes sent to the device are
    counted); ``transfers`` gives the number of row ranges a staged input is sent in."""

    def __init__(self, prefetch: bool, count: Callable, transfers: TransferSettings):
        self.count, self.transfers = count, transfers
        self.loader = self.writer = None
        if prefetch:  # named threads: profilers (tools/profile_ops.py, py-spy) tell them apart
            self.loader = cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="jgrind-loader")
            self.writer = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="jgrind-writer")

    def sweep(self, parts: Sequence, load: Callable, stage: bool = True) -> "SweepIO":
        """One sweep's I/O over ``parts``: ``load(part)`` gives a partition's step input.

        What ``load`` returns as NumPy arrays is handed to the device in the loading thread
        (`_staged`): on a GPU the host-to-device copy of the next partition's inputs then
        overlaps the running step, instead of running on the main thread when the step is
        dispatched. ``stage=False`` leaves them as they are, for a consumer that also reads
        them on the host."""
        if stage:
            load = _staged(load, self.count, self.transfers.staging_pieces,
                           self.transfers.input_staging)
        return SweepIO(self, list(parts), load)

    def close(self) -> None:
        for pool in (self.loader, self.writer):
            if pool is not None:
                pool.shutdown(wait=True)


class SweepIO:
    """One sweep's loads ahead of and writes behind its steps (the module's contract)."""

    def __init__(self, pipeline: Pipeline, parts: list, load: Callable):
        self._pipeline, self._parts, self._load = pipeline, parts, load
        self._in_flight: collections.deque = collections.deque()  # registered steps' markers
        self._pending: collections.deque = collections.deque()  # (step, queued write)
        self._yielded = self._registered = 0
        self._started = False

    def __enter__(self) -> "SweepIO":
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is None:  # an error in the sweep propagates as it is
            self.finish()

    def __iter__(self) -> Iterator:
        if self._started:
            raise PipelineError("a sweep's inputs can be iterated once")
        self._started = True
        return self._inputs()

    def _inputs(self) -> Iterator:
        """Yield ``(part, load(part))`` while the next partition's loads in the background.

        Before the next load starts, the step before the one just dispatched must have
        finished: so at most two partitions' inputs are alive, the running step's and the
        queued or loading one's, as the working-set bound assumes. Without that wait a loader
        faster than the compute lets the main thread queue step after step, each holding its
        input (seen: peak RSS 2 GiB over the bound on the 3M-node memory wall once the SSD
        tier's span loops went native)."""
        parts, load, loader, in_flight = self._parts, self._load, self._pipeline.loader, \
            self._in_flight
        future = loader.submit(load, parts[0]) if loader is not None and parts else None
        for i, part in enumerate(parts):
            h_in = load(part) if loader is None else future.result()
            interrupts.check()  # a SIGTERM whose exception was lost stops the run here
            if loader is not None and i + 1 < len(parts):
                # load i+1 is queued before step i is dispatched, and waits on the loader
                # thread for step i-1 (the last one registered): it then overlaps step i's
                # dispatch and the host copies and writes that follow it on this thread,
                # instead of starting after them
                future = loader.submit(_after, in_flight[-1] if in_flight else None,
                                       load, parts[i + 1])
            self._yielded += 1
            yield part, h_in
            if self._registered != self._yielded:
                raise PipelineError(
                    f"partition {part.index}'s step was not registered with dispatched() "
                    f"before the next input was asked for: the load of the partition after "
                    f"next would not wait for any step, and inputs would pile up")
            while len(in_flight) > 1:  # without a loader: step i-1 ends before load i+1
                done = in_flight.popleft()
                if loader is None:
                    jax.block_until_ready(done)

    def dispatched(self, step_output) -> None:
        """Register the step dispatched on the input just yielded (any of its outputs). What
        is kept is a one-element slice of it, ready when the step is: the output itself may
        be donated to the next step (the weight-gradient accumulator is) and then cannot be
        waited on."""
        if self._registered >= self._yielded:
            raise PipelineError(
                "dispatched() called twice for one input, or before the first: register "
                "each partition's step once, after its input is yielded")
        self._registered += 1
        self._in_flight.append(_marker(jax.tree.leaves(step_output)[0]))

    def write(self, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` on the writer thread, as a store of the step on the input last
        yielded. The writes of at most `MAX_PENDING_STEPS` steps wait in its queue: each holds
        a partition's output, so an unbounded queue (a writer slower than the compute, e.g.
        scatter-adds to SSD) would hold every partition's output at once. The bound counts
        steps, not writes: a step that keeps its aggregation stores two outputs, and with one
        write allowed to wait, queuing its second would wait for its first, so for its own
        kernels, before the next step could be dispatched. The outputs of the step running
        and of the one being stored are what the working-set bound counts
        (`jgrind.plan.cost.Workload.working_set`)."""
        writer = self._pipeline.writer
        if writer is None:
            fn(*args)
            return
        step = self._yielded
        self._pending.append((step, writer.submit(fn, *args)))
        while self._pending[0][0] <= step - MAX_PENDING_STEPS:
            self._pending.popleft()[1].result()

    def finish(self) -> None:
        """Wait for the queued writes; a writer's error is raised here, on the main thread."""
        while self._pending:
            self._pending.popleft()[1].result()


# Below this many bytes a step's output is copied whole to wait on (`_marker`)
MAX_COPIED_MARKER_BYTES = 1 << 20


def _marker(leaf: jax.Array) -> jax.Array:
    """Something ready when the step that made ``leaf`` (its first output) is, that lives on
    when ``leaf`` is donated to a later step: a copy of a small leaf (a weight-gradient
    accumulator), made by the runtime without a program, or a one-element slice of a large
    one (a step's output rows), one program per shape."""
    if leaf.nbytes <= MAX_COPIED_MARKER_BYTES:
        return jax.device_put(leaf, may_alias=False)
    return _first_element(leaf)


@jax.jit
def _first_element(leaf):
    """A one-element slice of a step output."""
    return leaf.reshape(-1)[:1]


def _after(step: Optional[jax.Array], load: Callable, part):
    """``load(part)`` once ``step`` (a registered step's marker, or None) has finished."""
    if step is not None:
        jax.block_until_ready(step)
    return load(part)


def _staged(load: Callable, count: Callable, pieces: int = 1,
            staging: Optional[transfers.PinnedStaging] = None) -> Callable:
    """``load`` followed by `jax.device_put` of each NumPy array in its result, and a gather
    whose device rows stayed on the device (`DeviceRows`) put together there; ``count``
    (`Store.count`) adds the bytes sent (``to_device``). On the CPU backend the put adopts an
    aligned buffer without a copy (`jgrind.hostio.buffers`), as the step's dispatch would; elsewhere
    it is the transfer, made where `SweepIO` calls ``load`` and waited for there: a step
    dispatched on an input whose host-side staging is still running holds the dispatching
    thread until it ends (seen on an H200: 17-19 ms a step). ``pieces`` > 1 sends a large
    array in that many row ranges at once (`_put`); an array in one of ``staging``'s
    page-locked buffers is put from there, whole."""
    def staged(part):
        leaves, tree = jax.tree.flatten(load(part))
        count(to_device=sum(_host_bytes(leaf) for leaf in leaves))
        put = [_to_device(leaf, pieces, staging) for leaf in leaves]
        # the NumPy arrays left are put in one call: each `jax.device_put` call costs tens of
        # microseconds on the host (70 us on CPU-2 for a small array, 130 us for three in one
        # call), paid in every partition step
        plain = [i for i, leaf in enumerate(put) if isinstance(leaf, np.ndarray)]
        if plain:
            for i, leaf in zip(plain, jax.device_put([put[i] for i in plain])):
                put[i] = leaf
        return jax.block_until_ready(jax.tree.unflatten(tree, put))
    return staged


def _host_bytes(leaf) -> int:
    """Bytes `_to_device` sends of ``leaf``."""
    if isinstance(leaf, DeviceRows):
        return leaf.host.nbytes
    return leaf.nbytes if isinstance(leaf, np.ndarray) else 0


def _to_device(leaf, pieces: int = 1, staging: Optional[transfers.PinnedStaging] = None):
    """``leaf`` on the device where it takes a put of its own: rows merged with device rows,
    an array in a page-locked buffer, or one sent in pieces; any other NumPy array is left as
    it is, for one `jax.device_put` of them all (`_staged`)."""
    if isinstance(leaf, DeviceRows):
        return leaf.to_device()
    if not isinstance(leaf, np.ndarray):
        return leaf
    pinned = staging.to_device(leaf) if staging is not None else None
    if pinned is not None:
        return _uncommitted(pinned)
    return _put(leaf, pieces) if _pieces(leaf, pieces) >= 2 else leaf


def _uncommitted(array: jax.Array) -> jax.Array:
    """``array`` (on one device), its buffer as it is, as an uncommitted array, as every other
    step input is. A put to an explicit memory (a page-locked buffer's put to the device)
    commits its result; jit compiles a committed argument apart from an uncommitted one (its
    sharding is then part of the program), and the outputs of a step with a committed
    argument are committed in turn. With page-locked inputs an H200 compiled programs in
    three epochs running (47, 33, then 1), as committed outputs reached the parameters, the
    spare buffers and the device tables (tests/test_program_count.py). JAX has no public
    way to drop the commitment; its array constructor takes it."""
    if not array.committed:
        return array
    try:
        from jax._src.array import ArrayImpl
        return ArrayImpl(array.aval, array.sharding, [array], committed=False)
    except (ImportError, TypeError):  # another JAX: compiled apart, but the values are right
        return array


def _put(host: np.ndarray, pieces: int) -> jax.Array:
    """`jax.device_put` of ``host``, in up to ``pieces`` row ranges put at once and joined on
    the device. From pageable memory a transfer first copies its bytes into a page-locked
    staging buffer on one of the runtime's threads (on an H200, 18-22 ms for a 109 MB step
    input, about 5.5 GB/s, against 2 ms over the link); ranges put at once are staged on
    several."""
    k = _pieces(host, pieces)
    if k < 2:
        return jax.device_put(host)
    bounds = [host.shape[0] * i // k for i in range(k + 1)]
    return _join_rows(*[jax.device_put(host[a:b]) for a, b in zip(bounds[:-1], bounds[1:])])


def _pieces(host: np.ndarray, pieces: int) -> int:
    """How many row ranges `_put` sends ``host`` in (under 2: whole)."""
    return min(pieces, host.nbytes // MIN_PIECE_BYTES) if host.ndim else 1


@jax.jit
def _join_rows(*parts):
    """Row ranges put apart (`_put`), joined on the device."""
    return jnp.concatenate(parts, axis=0)
