"""Measuring a hardware profile (`jgrind.plan.profile.Profile`): timing, on this machine, the
operations the engine performs.

Datasheet numbers are no use to the planner: a VM disk, a container's CPU quota or a page cache
that answers instead of the SSD change the answer. So `measure` runs what the engine runs (jitted
products and sparse steps, native row gathers and scatter-adds, host <-> device copies, the SSD
tier's reads and writes of spans) and records how fast each went.

Rates are the fastest of a few repeats after a warm-up (jitted functions compiled first): other
work on the machine only slows a run down. Latencies and the overlap factor are medians.
SSD figures keep the page cache out of the way (``O_DIRECT`` where the filesystem allows it,
``posix_fadvise(DONTNEED)`` otherwise): a file just written is still in RAM, and reading it
back would measure memory, not the disk.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import errno
import functools
import mmap
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jgrind import _kernels
from jgrind.hostio import codecs, host_memory, transfers
from jgrind.hostio.buffers import aligned_empty
from jgrind.hostio.checksum import checksum, row_checksums
from jgrind.generators import csbm
from jgrind.loss import node_weights, weighted_cross_entropy
from jgrind.models.matmul import matmul  # the layers' products, at their precision
from jgrind.models.model import gcn
from jgrind.plan.cost import FUSED_REFERENCE, SPAN_PIECE_BYTES
from jgrind.plan.hardware import PROFILE_VERSION, Profile, ProfileError, machine_fingerprint
from jgrind.hostio.rows import add_rows, take_rows
from jgrind.sparse import adjacency, spmm

_MIB = 2**20
_PAGE = 4096


@dataclasses.dataclass(frozen=True)
class _Sizes:
    matmul: tuple[int, int]          # (m, k): chained (m x k) @ (k x k) products
    matmul_chain: int                # products per jitted call
    contraction: tuple[int, int, int]  # x.T @ g: rows, width of x, width of g
    spmm: tuple[int, int, int]       # rows (= columns), nonzeros, width
    spmm_block: tuple[int, int, int, int]  # a partition step's block: rows, columns (its rows
    #                                        and halo), nonzeros, width; an input the caches hold
    latency_calls: int               # synchronous calls per latency batch
    gather: tuple[int, int, int]     # table rows, width, rows gathered
    copy_bytes: int
    transfer_bytes: int              # host <-> device
    small_transfer_bytes: int        # host -> device, a partition-sized buffer
    ssd_bytes: int                   # size of the SSD test file
    chunk: int                       # bytes per sequential write / read call
    random_reads: int                # 4 KiB reads per latency batch
    target: float                    # seconds per timed batch of compute
    overlap_seconds: float           # duration of each side of the overlap test
    repeats: int
    fused: tuple[int, ...]           # nodes of the whole-graph steps' graphs (mean degree 10)


_FULL = _Sizes(matmul=(4096, 256), matmul_chain=8, contraction=(100_000, 256, 8),
               spmm=(200_000, 2_000_000, 64),
               spmm_block=(3_000, 15_000, 30_000, 64),
               latency_calls=200, gather=(1_000_000, 64, 250_000), copy_bytes=256 * _MIB,
               transfer_bytes=64 * _MIB, small_transfer_bytes=4 * _MIB, ssd_bytes=256 * _MIB,
               chunk=8 * _MIB,
               random_reads=256, target=0.2, overlap_seconds=0.3, repeats=5,
               fused=(40_000, 160_000))
_QUICK = _Sizes(matmul=(1024, 128), matmul_chain=4, contraction=(10_000, 64, 8),
                spmm=(20_000, 100_000, 32),
                spmm_block=(500, 2_500, 5_000, 32),
                latency_calls=30, gather=(50_000, 32, 12_500), copy_bytes=8 * _MIB,
                transfer_bytes=4 * _MIB, small_transfer_bytes=1 * _MIB, ssd_bytes=16 * _MIB,
                chunk=4 * _MIB,
                random_reads=32, target=0.02, overlap_seconds=0.04, repeats=3,
                fused=(2_000, 4_000))


def measure(directory: str | os.PathLike | None = None, *, quick: bool = False,
            progress: bool = False,
            machinery: Optional[Callable[[pathlib.Path], dict]] = None) -> Profile:
    """Measure this machine; the SSD figures on the disk that holds ``directory`` (default: the
    system temporary directory; pass the store directory the SSD tier will use).

    Takes roughly 10-30 s (``quick``: about 2 s, with sizes too small for stable figures; for
    tests). ``progress`` prints one line per figure to stderr. Its temporary file is removed
    whatever happens. Measure on an otherwise idle machine: a concurrent job lowers the compute
    figures, and the profile is reused by later runs.

    ``machinery``: ``directory -> {"forward", "top", "backward", "params", "ssd_call",
    "device_mix", "kept_forward", "kept_backward", "kept_params"}``, the engine's own seconds per partition step, measured by running it
    (`jgrind.engine.machinery.measure`, which `jgrind.plan.profile.measure` passes: this layer
    cannot import the engine); None leaves them unmeasured. Not run when ``quick``.
    """
    root = _check_directory(directory)
    sizes = _QUICK if quick else _FULL
    free = shutil.disk_usage(root).free
    if free < 2 * sizes.ssd_bytes:
        raise ProfileError(f"{root} has {free / _MIB:.0f} MiB free; measuring its disk needs "
                           f"{2 * sizes.ssd_bytes / _MIB:.0f} MiB: free space or pass another "
                           "directory (--store)")

    def report(line: str) -> None:
        if progress:
            print(f"profile: {line}", file=sys.stderr, flush=True)

    rng = np.random.default_rng(0)
    matmul_step, matmul_x, matmul_work = _matmul_step(sizes, rng)
    matmul_flops = _chain_rate(matmul_step, matmul_x, matmul_work, sizes)
    m, k = sizes.matmul
    report(f"dense matmul {matmul_flops / 1e9:.1f} GFLOP/s ({m}x{k} @ {k}x{k})")
    contraction_bw = _contraction_bw(sizes, rng)
    report(f"weight-gradient contraction {contraction_bw / 1e9:.2f} GB/s "
           f"(x.T @ g, x {sizes.contraction[0]}x{sizes.contraction[1]}, "
           f"g {sizes.contraction[0]}x{sizes.contraction[2]})")
    spmm_rate = _spmm_rate(sizes, rng)
    spmm_cached_rate = _spmm_block_rate(sizes, rng)
    spmm_bytes = sizes.spmm[0] * sizes.spmm[2] * 4
    spmm_cached_bytes = sizes.spmm_block[1] * sizes.spmm_block[3] * 4
    report(f"sparse spmm {spmm_rate / 1e9:.2f} G nonzeros*width/s "
           f"({sizes.spmm[1]} nonzeros, width {sizes.spmm[2]}, input {spmm_bytes / 1e6:.1f} MB), "
           f"{spmm_cached_rate / 1e9:.2f} G/s on a partition's block ({sizes.spmm_block[2]} "
           f"nonzeros, input {spmm_cached_bytes / 1e6:.1f} MB)")
    step_latency = _step_latency(sizes)
    report(f"step latency {step_latency * 1e3:.3f} ms")
    sweep_step = _sweep_step(sizes)
    report(f"sweep step {sweep_step * 1e3:.3f} ms (a pipelined step with no data)")
    device_call = _device_call(sizes)
    report(f"device-tier call {device_call * 1e3:.3f} ms (a block write, a row take, a row add)")
    cached_take, cache_lookup = _cached_takes(sizes, rng)
    report(f"halo owner through the host cache: {cached_take * 1e6:.1f} us from a cached "
           f"block, {cache_lookup * 1e6:.1f} us to look one up that is not")
    fused_steps = tuple(_fused_step(nodes, sizes.repeats) for nodes in sizes.fused)
    for nodes, edges, seconds in fused_steps:
        report(f"whole-graph step {seconds * 1e3:.1f} ms (reference GCN, {nodes} nodes, "
               f"{edges} edges)")
    (gather_bw, gather_row), (scatter_add_bw, scatter_add_row) = _row_rates(sizes, rng)
    report(f"host gather {gather_bw / 1e9:.2f} GB/s + {gather_row * 1e9:.1f} ns per row, "
           f"scatter-add {scatter_add_bw / 1e9:.2f} GB/s + {scatter_add_row * 1e9:.1f} ns per row")
    copy_bw = _copy_bw(sizes)
    report(f"host copy {copy_bw / 1e9:.2f} GB/s")
    checksum_bw = _checksum_bw(sizes)
    report(f"checksum {checksum_bw / 1e9:.2f} GB/s")
    codec_bw = codecs.conversion_rates(rows=min(sizes.copy_bytes, 32 * _MIB) // (4 * 128))
    report("storage dtypes (encode/decode) " + ", ".join(
        f"{k} {e / 1e9:.2f}/{d / 1e9:.2f} GB/s" for k, (e, d) in codec_bw.items()))
    overlap = _overlap(matmul_step, matmul_x, matmul_work / matmul_flops, sizes, rng)
    report(f"overlap {overlap:.2f} (a row gather on a thread beside the matmul)")
    io_parallel = _io_parallel(matmul_step, matmul_x, matmul_work / matmul_flops, overlap,
                               sizes, rng)
    report(f"reads beside writes {io_parallel:.2f} (a row gather and a scatter-add on two "
           "threads, beside the matmul)")
    to_device_bw, to_device_small_bw, to_host_bw = _transfer_bw(sizes)
    report(f"host -> device {to_device_bw / 1e9:.2f} GB/s "
           f"({to_device_small_bw / 1e9:.2f} GB/s at {sizes.small_transfer_bytes / _MIB:.0f} MiB), "
           f"device -> host {to_host_bw / 1e9:.2f} GB/s")
    link_to_device_bw, link_to_host_bw, pageable_to_host_bw = link_rates(sizes.transfer_bytes,
                                                                         sizes.repeats)
    report(f"link {link_to_device_bw / 1e9:.2f} GB/s to the device, {link_to_host_bw / 1e9:.2f} "
           f"GB/s back (pinned host memory); pageable device -> host "
           f"{pageable_to_host_bw / 1e9:.2f} GB/s")

    fd, name = _make_file(root)
    try:
        ssd_write_bw = _ssd_write(fd, sizes, rng)
        report(f"SSD write {ssd_write_bw / 1e9:.2f} GB/s (+ fsync, in {root})")
        with _UncachedReader(name, sizes.chunk) as reader:
            ssd_read_bw = max(
                sizes.ssd_bytes / reader.read(sizes.ssd_bytes) for _ in range(sizes.repeats))
            how = "O_DIRECT" if reader.direct else "buffered, after fadvise(DONTNEED)"
            report(f"SSD read {ssd_read_bw / 1e9:.2f} GB/s ({how})")
            ssd_latency = reader.random_latency(sizes.random_reads, sizes.repeats, rng)
            report(f"SSD 4 KiB random read {ssd_latency * 1e3:.3f} ms")
        cached_write_bw, cached_read_bw, cached_latency = _page_cache(fd, name, sizes, rng)
        report(f"page cache: read {cached_read_bw / 1e9:.2f} GB/s, write "
               f"{cached_write_bw / 1e9:.2f} GB/s, 4 KiB read {cached_latency * 1e3:.4f} ms")
        read_call, update_call = _row_call_overheads(fd, sizes, cached_latency)
        report(f"row-span calls: {read_call * 1e6:.1f} us per read, {update_call * 1e6:.1f} us "
               "per read-add-write, beyond the I/O")
    finally:
        os.close(fd)
        pathlib.Path(name).unlink(missing_ok=True)
    steps = {} if machinery is None or quick else machinery(root)
    if steps:
        report(f"engine step {steps['forward'] * 1e3:.3f} ms forward, {steps['top'] * 1e3:.3f} "
               f"ms top, {steps['backward'] * 1e3:.3f} ms backward, {steps['params'] * 1e3:.3f} "
               f"ms first layer's; +{steps['ssd_call'] * 1e3:.3f} ms per SSD call, "
               f"+{steps['device_mix'] * 1e3:.3f} ms per halo call on a table split between "
               "the device and other tiers")

    return Profile(
        version=PROFILE_VERSION, machine=machine_fingerprint(),
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        matmul_flops=matmul_flops, contraction_bw=contraction_bw, spmm_rate=spmm_rate,
        spmm_cached_rate=spmm_cached_rate, spmm_bytes=spmm_bytes,
        spmm_cached_bytes=spmm_cached_bytes,
        step_latency=step_latency, sweep_step=sweep_step, device_call=device_call,
        cached_take=cached_take, cache_lookup=cache_lookup,
        gather_bw=gather_bw, gather_row_seconds=gather_row, scatter_add_bw=scatter_add_bw,
        scatter_add_row_seconds=scatter_add_row, copy_bw=copy_bw,
        to_device_bw=to_device_bw, to_device_small_bw=to_device_small_bw,
        to_device_bytes=sizes.transfer_bytes, to_device_small_bytes=sizes.small_transfer_bytes,
        to_host_bw=to_host_bw, link_to_device_bw=link_to_device_bw,
        link_to_host_bw=link_to_host_bw, pageable_to_host_bw=pageable_to_host_bw,
        ssd_read_bw=ssd_read_bw, ssd_write_bw=ssd_write_bw, ssd_latency=ssd_latency,
        cached_read_bw=cached_read_bw, cached_write_bw=cached_write_bw,
        cached_latency=cached_latency, read_call_overhead=read_call,
        update_call_overhead=update_call, overlap=overlap, io_parallel=io_parallel,
        checksum_bw=checksum_bw, codec_bw=codec_bw,
        fused_steps=fused_steps,
        **{f"machinery_{kind}": float(seconds) for kind, seconds in steps.items()},
        device_free=_device_free(jax.devices()[0]),
        host_free=host_memory.available(),
        ssd_free=int(shutil.disk_usage(root).free),
        directory=str(root))


def _check_directory(directory: str | os.PathLike | None) -> pathlib.Path:
    root = pathlib.Path(directory if directory is not None else tempfile.gettempdir())
    root = root.expanduser()
    if not root.exists():
        raise ProfileError(f"directory {root} does not exist; create it, or pass the directory "
                           "the SSD tier will use (--store)")
    if not root.is_dir():
        raise ProfileError(f"{root} is not a directory; pass the directory the SSD tier will "
                           "use (--store)")
    if not os.access(root, os.W_OK | os.X_OK):
        raise ProfileError(f"directory {root} is not writable; pass a directory you can write "
                           "to on the disk the SSD tier will use (--store)")
    return root.resolve()


def _device_free(device) -> int:
    """Free bytes on ``device``: its allocator's limit minus use where it reports them (GPU,
    TPU); on the CPU backend "device" memory is host RAM."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends that do not implement it raise various errors
        stats = None
    if stats and "bytes_limit" in stats and "bytes_in_use" in stats:
        return max(0, int(stats["bytes_limit"]) - int(stats["bytes_in_use"]))
    return host_memory.available()


# -- compute -------------------------------------------------------------------------------------

def _chain_rate(step: Callable, x, work: float, sizes: _Sizes) -> float:
    """Work per second of ``x = step(x)``, with enough calls per timed batch to fill
    ``sizes.target`` seconds (so dispatch and sync do not count), fastest of the repeats."""
    _time_chain(step, x, 1)  # compiles
    once = _time_chain(step, x, 1)
    calls = max(1, min(100_000, round(sizes.target / max(once, 1e-9))))
    times = [_time_chain(step, x, calls) for _ in range(sizes.repeats)]
    return work * calls / min(times)


def _time_chain(step: Callable, x, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        x = step(x)
    x.block_until_ready()
    return time.perf_counter() - start


def _matmul_step(sizes: _Sizes, rng: np.random.Generator):
    """A jitted chain of ``x @ w`` products (several per call, so that dispatch does not count
    even on a fast accelerator); ``w`` is orthogonal, so values neither blow up nor decay into
    denormals however many calls follow each other. Returns the step, its input and flops."""
    m, k = sizes.matmul
    chain = sizes.matmul_chain
    w, _ = np.linalg.qr(rng.standard_normal((k, k)))
    w = jax.device_put(w.astype(np.float32))
    x = jax.device_put(rng.standard_normal((m, k), dtype=np.float32))

    @jax.jit
    def products(x, w, n):
        # n is traced: a real loop, so the compiler cannot reassociate the chain into
        # x @ (w @ w @ ...), which would do less work than is counted.
        return jax.lax.fori_loop(0, n, lambda _, y: matmul(y, w), x)

    return (lambda x: products(x, w, chain)), x, 2.0 * m * k * k * chain


def _contraction_bw(sizes: _Sizes, rng: np.random.Generator) -> float:
    """Bytes/s of ``x.T @ g`` (both read once) for a tall ``x`` and a narrow ``g``: the weight
    gradient of a layer into few outputs (a top layer's ``A (X W)``: ``X^T (A^T g)``). On XLA's
    CPU backend this contraction over the long row dimension runs at a small fraction of the
    matmul rate (~10 GFLOP/s against ~150 here) and of the copy rate, so its flops misprice
    it several-fold: a 256 -> 8 top step is mostly this."""
    rows, width, narrow = sizes.contraction
    x = jax.device_put(rng.standard_normal((rows, width), dtype=np.float32))
    g = jax.device_put(rng.standard_normal((rows, narrow), dtype=np.float32))
    weight_grad = jax.jit(lambda x, g: matmul(x.T, g))
    weight_grad(x, g).block_until_ready()
    return _best_rate(4 * rows * (width + narrow),
                      lambda: weight_grad(x, g).block_until_ready(), sizes.repeats)


def spmm_operands(rows: int, nnz: int, width: int, rng: np.random.Generator,
                  columns: Optional[int] = None) -> tuple:
    """``(A, x, stored)`` on the device as the profile's sparse product takes them: a random
    ``A`` of ``rows`` rows and ``columns`` columns (default: square) with uniform degrees
    (``nnz // rows`` each) and mean weights, a ``columns x width`` input, and ``A``'s stored
    entries (also for tools/probe_spmm.py, which varies the sizes and shapes)."""
    columns = rows if columns is None else columns
    degree = max(1, nnz // rows)
    indptr = np.arange(rows + 1, dtype=np.int64) * degree
    indices = np.sort(rng.integers(0, columns, (rows, degree), dtype=np.int32), axis=1).ravel()
    adj = jax.device_put(adjacency(indptr, indices, np.full(indices.size, 1 / degree,
                                                           np.float32), columns))
    x = jax.device_put(rng.standard_normal((columns, width), dtype=np.float32))
    return adj, x, indices.size


def _spmm_rate(sizes: _Sizes, rng: np.random.Generator) -> float:
    """``A @ x`` through `jgrind.sparse.spmm` (the default backend, jitted) on
    `spmm_operands`, chained so that each product feeds the next."""
    rows, nnz, width = sizes.spmm
    adj, x, stored = spmm_operands(rows, nnz, width, rng)
    product = jax.jit(spmm)
    return _chain_rate(lambda x: product(adj, x), x, float(stored) * width, sizes)


def _spmm_block_rate(sizes: _Sizes, rng: np.random.Generator) -> float:
    """The same product on a partition step's shape (`_Sizes.spmm_block`): a few thousand
    rows out of five times as many rows and halo in, each input row read about twice, an input
    of a few MB (`queued_spmm_rate`)."""
    rows, columns, nnz, width = sizes.spmm_block
    return queued_spmm_rate(rows, columns, nnz, width, rng, sizes.target, sizes.repeats)


def queued_spmm_rate(rows: int, columns: int, nnz: int, width: int, rng: np.random.Generator,
                     target: float = 0.2, repeats: int = 5) -> float:
    """Nonzeros x width per second of `jgrind.sparse.spmm` (jitted) on `spmm_operands` of
    the given shape, its calls queued back to back on one input (dispatch hides behind the
    kernels) and waited for once, enough of them to fill ``target`` seconds; the fastest of
    ``repeats`` batches (also for tools/probe_spmm.py)."""
    adj, x, stored = spmm_operands(rows, nnz, width, rng, columns=columns)
    product = jax.jit(spmm)

    def calls(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            y = product(adj, x)
        y.block_until_ready()
        return time.perf_counter() - start
    calls(1)  # compiles
    n = max(1, min(100_000, round(target / max(calls(1), 1e-9))))
    return float(stored) * width * n / min(calls(n) for _ in range(repeats))


def _fused_step(nodes: int, repeats: int) -> tuple[int, int, float]:
    """(nodes, edges, seconds) of one jitted whole-graph training step (forward, backward,
    adam update) of the reference GCN (`jgrind.plan.cost.FUSED_REFERENCE`) on a generated
    graph of ``nodes`` nodes, fastest of ``repeats`` after a compiling call. The fast path is
    priced from these: one whole-graph program runs faster than its operations priced one by
    one (XLA fuses them), and slower per row as its tensors outgrow the caches and glibc's
    reusable heap (fresh pages fault in every step)."""
    ref = FUSED_REFERENCE
    degree = 10.0
    graph = csbm(num_nodes=nodes, num_classes=ref["classes"], num_features=ref["features"],
                 avg_degree=degree, seed=0)
    model = gcn(graph.num_features, ref["hidden"], graph.num_classes,
                num_layers=ref["layers"], dropout=ref["dropout"])
    block = jax.device_put(model.block(model.normalize(graph)))
    x, labels = jax.device_put(graph.features), jax.device_put(graph.labels)
    weights = jax.device_put(node_weights(graph.train_mask[0]))
    optimizer = optax.adam(1e-3)

    def loss_fn(params, block, x, labels, weights, key):
        return weighted_cross_entropy(model.apply(params, block, x, key), labels, weights)

    # as `jgrind.train.InMemory` runs it: the graph passed in, not closed over (XLA would
    # compile closed-over arrays in as constants), the old parameters donated
    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, block, x, labels, weights, key):
        loss, grads = jax.value_and_grad(loss_fn)(params, block, x, labels, weights, key)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params = model.init(jax.random.key(0))
    opt_state = optimizer.init(params)
    times = []
    for i in range(repeats + 1):  # the first call compiles
        start = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, block, x, labels, weights,
                                       jax.random.key(i))
        loss.block_until_ready()
        times.append(time.perf_counter() - start)
    return graph.num_nodes, graph.num_edges, min(times[1:])


STEP_ARGUMENTS = 16  # arrays a layer step takes: parameters, the block's adjacency (A and
#                     A^T: 3 arrays each), node ids, inputs, key, output gradient, mask, the
#                     gradient sum


def _step_latency(sizes: _Sizes) -> float:
    """Seconds per call of a trivial jitted function taking `STEP_ARGUMENTS` small arrays (a
    call's cost grows with its arguments), each call waited for."""
    tiny = jax.jit(lambda args: sum(a[0] for a in args))
    args = [jax.device_put(np.zeros(8, np.float32)) for _ in range(STEP_ARGUMENTS)]
    tiny(args).block_until_ready()
    batches = []
    for _ in range(sizes.repeats):
        start = time.perf_counter()
        for _ in range(sizes.latency_calls):
            tiny(args).block_until_ready()
        batches.append((time.perf_counter() - start) / sizes.latency_calls)
    return statistics.median(batches)


SWEEP_STEP_ROWS = 64  # rows of the trivial step's input and output: no data to speak of


def _sweep_step(sizes: _Sizes) -> float:
    """Seconds per partition step of a sweep whose steps move and compute next to nothing: what
    the engine's machinery costs a step (`jgrind.engine.pipeline`), beyond the compute and the
    I/O the cost model prices.

    Runs the pipeline's pattern with trivial work: a loader thread (of two) waits for the step
    before last, then puts the next step's two input arrays on the device in one call and
    waits for them; the main thread takes them, queues the next load, puts a spare buffer (a
    placeholder, `jgrind.engine.spares`), dispatches a step with `STEP_ARGUMENTS` arguments,
    makes a marker to wait on, starts the output's host copy, and queues its store on a
    writer thread, waiting for the write before last; the writer reads the output on the host
    and copies it into a table. Median per step over ``sizes.latency_calls`` steps, over
    repeats. On CPU-2, idle, this was 0.86-1.05 ms against a step latency (one call, waited
    for) of 0.03-0.04 ms: thread hand-offs and JAX's host-side work per call, which the cost
    model missed, and which is most of a small partition's step."""
    import concurrent.futures as cf

    rows, width = SWEEP_STEP_ROWS, 16

    def fn(*args):
        *rest, x, g, _spare = args
        return x * 2.0 + g + sum(a[0] for a in rest)

    step = jax.jit(fn, donate_argnums=STEP_ARGUMENTS - 1, keep_unused=True)
    marker = jax.jit(lambda out: out.reshape(-1)[:1])
    rest = [jax.device_put(np.zeros(8, np.float32)) for _ in range(STEP_ARGUMENTS - 3)]
    inputs = [aligned_empty((rows, width)) for _ in range(2)]
    for array in inputs:
        array.fill(1.0)
    table = np.zeros((rows, width), np.float32)

    def load(before):
        if before is not None:
            jax.block_until_ready(before)
        return jax.block_until_ready(jax.device_put(inputs))

    def store(out) -> None:
        np.copyto(table, np.asarray(out))

    def sweep(loader, writer, steps: int) -> float:
        start = time.perf_counter()
        future, markers, pending = loader.submit(load, None), [], []
        for i in range(steps):
            x, g = future.result()
            if i + 1 < steps:
                future = loader.submit(load, markers[-1] if markers else None)
            out = step(*rest, x, g, jax.device_put(aligned_empty((rows, width))))
            markers = markers[-1:] + [marker(out)]
            out.copy_to_host_async()
            pending.append(writer.submit(store, out))
            while len(pending) > 1:
                pending.pop(0).result()
        for write in pending:
            write.result()
        return (time.perf_counter() - start) / steps

    with cf.ThreadPoolExecutor(2, thread_name_prefix="jgrind-profile-loader") as loader, \
            cf.ThreadPoolExecutor(1, thread_name_prefix="jgrind-profile-writer") as writer:
        sweep(loader, writer, 2)  # compiles
        return statistics.median(sweep(loader, writer, sizes.latency_calls)
                                 for _ in range(sizes.repeats))


# A device table's rows and width, and rows per call: a table as wide and long as a layer's
# device blocks (a hidden layer's 128 floats), few rows. The width matters more than the
# bytes: XLA's CPU backend splits the fused take of rows this wide across its threads
# (``outer_dimension_partitions`` in the compiled program), as it does for every device-tier
# call of the engine, while an 8-wide table's take runs on one; the split calls wait for the
# thread pool, which the engine's partition steps keep busy (a row take measured 2.4-3.9 ms in
# the engine against 0.23 ms priced from an 8-wide table).
DEVICE_CALL_ROWS = (65536, 128, 64)


def _bucket_len(n: int) -> int:
    """The device tier's index length for ``n`` rows: the next power of two, at least 8
    (`jgrind.engine.tiers.device.bucket_len`), so that few shapes compile."""
    return 1 << max(int(n - 1).bit_length(), 3)


# the device tier's table operations (`jgrind.engine.tiers.device`): padding indices are out of
# range, dropped by a set or add and read as zero rows by a take
_device_set = jax.jit(lambda t, i, v: t.at[i].set(v, mode="drop"), donate_argnums=0)
_device_add = jax.jit(lambda t, i, v: t.at[i].add(v, mode="drop"), donate_argnums=0)
_device_take = jax.jit(lambda t, i: jnp.take(t, i, axis=0, mode="fill", fill_value=0))


def _device_call(sizes: _Sizes) -> float:
    """Seconds per call of the device tier, as `jgrind.engine.tiers.device` makes its calls on
    a table of a layer's shape (`DEVICE_CALL_ROWS`): a block written into the table (index
    rows padded to the tier's bucket length and values put on the device, a jitted
    ``table.at[rows].set`` donating the table), rows taken (a jitted ``jnp.take`` in ``fill``
    mode), read back and set into their places in a host buffer, as a gather's rows are, and
    rows added (``table.at[rows].add``, donated). Each call is waited for; the mean of the
    three, median over repeats. The rows are few, so this is the call's fixed cost: index and
    value puts, dispatch, the threads XLA splits the call over, donation, the wait. (The step
    latency, which the cost model charged before, is one jitted call of small arguments.)"""
    table_rows, width, rows = DEVICE_CALL_ROWS
    put = lambda *args: [jax.device_put(a) for a in args]  # noqa: E731  (as the tier does)
    length = _bucket_len(rows)
    index = np.full(length, table_rows, np.int32)  # out of range: the padding
    values = aligned_empty((length, width))
    values.fill(1.0)
    out = aligned_empty((4 * rows, width))  # a gathered input, the taken rows scattered in it
    dst = np.random.default_rng(0).permutation(out.shape[0])[:rows]
    state = {"table": jax.device_put(np.zeros((table_rows, width), np.float32))}

    def calls(n: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            index[:rows] = np.arange(rows) + (i * rows) % (table_rows - rows)
            state["table"] = _device_set(state["table"], *put(index, values))
            state["table"].block_until_ready()
            out[dst] = jax.device_get(_device_take(state["table"], *put(index)))[:rows]
            state["table"] = _device_add(state["table"], *put(index, values))
            state["table"].block_until_ready()
        return (time.perf_counter() - start) / (3 * n)

    calls(2)  # compiles
    return statistics.median(calls(sizes.latency_calls) for _ in range(sizes.repeats))


# blocks, rows per block, row width and rows taken per block of `_cached_takes`: few narrow
# rows, so a take's time is its fixed cost
CACHED_TAKE_ROWS = (64, 300, 8, 4)


def _cached_takes(sizes: _Sizes, rng: np.random.Generator) -> tuple[float, float]:
    """``(take, lookup)`` seconds per halo owner of a gather through a host cache that cannot
    hold the layer's SSD file, as the SSD tier serves its owners one by one
    (`jgrind.engine.tiers.cached_ssd`, ``take_rows``): an owner whose block the cache holds
    costs a lookup under the cache's lock, its rows' file indices shifted to the block's, and
    a `jgrind.hostio.rows.take_rows` into scattered rows of the step input; an owner it does
    not hold costs the lookup and the check whether its block would fit (its rows are then
    read as spans, priced apart). A few rows per owner, so these are the fixed costs that the
    byte and row rates leave out: on 256 partitions a gather sweep serves ~17k (partition,
    owner) pairs so."""
    blocks, block_rows, width, taken = CACHED_TAKE_ROWS
    lock = threading.Lock()
    cached = {("table", b): np.asarray(rng.random((block_rows, width)), np.float32)
              for b in range(blocks)}
    entries = collections.OrderedDict(cached)
    start = np.arange(blocks, dtype=np.int64) * block_rows  # the blocks' rows in the file
    src = np.concatenate([start[b] + np.sort(rng.choice(block_rows, taken, replace=False))
                          for b in range(blocks)]).astype(np.int32)
    dst = rng.permutation(blocks * taken).astype(np.int32)
    out = np.zeros((blocks * taken, width), np.float32)
    segments = [(b * taken, (b + 1) * taken, b) for b in range(blocks)]
    passes = max(1, sizes.latency_calls // 10)

    def take() -> None:
        for _ in range(passes):
            for a, b, owner in segments:
                with lock:
                    rows = entries.get(("table", owner))
                    entries.move_to_end(("table", owner))
                take_rows(rows, src[a:b] - start[owner], out=out, dst=dst[a:b])

    capacity, pinned, nbytes = 1 << 20, 1 << 19, block_rows * width * 4
    missing: dict = {}

    def look_up() -> None:
        direct = []
        for _ in range(passes):
            for a, b, owner in segments:
                with lock:
                    rows = missing.get(("table", owner))
                if rows is None:
                    with lock:
                        fits = pinned + nbytes <= capacity
                    if not fits:
                        direct.append((a, b))
        direct.clear()

    calls = passes * blocks
    return _best_seconds(take, sizes.repeats) / calls, _best_seconds(look_up, sizes.repeats) / calls


# -- host memory and transfers ---------------------------------------------------------------

def _best_rate(nbytes: int, run: Callable[[], None], repeats: int) -> float:
    """``nbytes`` over the fastest of ``repeats`` runs of ``run()`` (`_best_seconds`: other
    work on the machine only ever slows a run down, so the fastest is the cleanest)."""
    return nbytes / _best_seconds(run, repeats)


def _best_seconds(run: Callable[[], None], repeats: int) -> float:
    """The fastest of ``repeats`` runs of ``run()``, after an untimed warm-up."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def _row_rates(sizes: _Sizes, rng: np.random.Generator):
    """``((gather_bw, gather_row_seconds), (scatter_add_bw, scatter_add_row_seconds))``: host
    row gathers and scatter-adds as the store does them for halo rows, with the store's own
    `jgrind.hostio.rows` functions: random rows in ascending order, gathered into scattered rows of
    the output buffer. Timed at two row widths on tables of the same row count; a row then
    costs ``row_seconds + bytes / bw``. Narrow rows (a few classes wide) cost far more per
    byte than the bytes alone: each is a cache miss and a call of the copy loop."""
    rows, width, picked = sizes.gather
    narrow = max(1, width // 8)
    idx = np.sort(rng.choice(rows, picked, replace=False))
    out_rows = picked + picked // 4
    dst = np.sort(rng.choice(out_rows, picked, replace=False))
    seconds = {}
    for w in (narrow, width):
        table = np.ones((rows, w), np.float32)
        out = np.empty((out_rows, w), np.float32)
        seconds[w] = (_best_seconds(lambda: take_rows(table, idx, out=out, dst=dst),
                                    sizes.repeats),
                      _best_seconds(lambda: add_rows(table, idx, out, src=dst), sizes.repeats))

    def fit(i: int) -> tuple[float, float]:
        lo, hi = seconds[narrow][i], seconds[width][i]
        per_byte = max(hi - lo, 1e-12) / (picked * (width - narrow) * 4)
        per_row = max(lo / picked - narrow * 4 * per_byte, 0.0)
        return 1.0 / per_byte, per_row

    return fit(0), fit(1)


def _copy_bw(sizes: _Sizes) -> float:
    src = np.ones(sizes.copy_bytes // 4, np.float32)
    dst = np.empty_like(src)
    return _best_rate(src.nbytes, lambda: np.copyto(dst, src), sizes.repeats)


def _checksum_bw(sizes: _Sizes) -> float:
    """`jgrind.hostio.checksum` bytes/s: the SSD tier checksums every whole block it writes and checks
    it on every whole-block read (`jgrind.engine.ssd`)."""
    data = np.random.default_rng(0).integers(0, 255, sizes.transfer_bytes, np.uint8)
    return _best_rate(data.nbytes, lambda: checksum(data), sizes.repeats)


def _transfer_bw(sizes: _Sizes) -> tuple[float, float, float]:
    """Host -> device (``device_put``) bytes/s of a large and of a small (partition-sized)
    array, and device -> host bytes/s as the engine reads a step output on the host
    (`jgrind.hostio.transfers`)."""
    # What a gather pays beyond copying its rows: a fresh buffer from the store
    # (`jgrind.hostio.buffers`), filled (its pages fault on first write) and handed to the device,
    # less the time to fill a buffer whose pages are already mapped (the row copies, which the
    # cost model prices at `copy_bw`). On the CPU backend XLA adopts the aligned buffer in
    # place, so the page faults are most of it; on a GPU the copy to the device is.
    def rate(nbytes):
        warm = aligned_empty(nbytes // 4, np.float32)
        warm.fill(0.0)
        fill = nbytes / _best_rate(nbytes, lambda: warm.fill(1.0), sizes.repeats)
        times = []
        for i in range(sizes.repeats + 1):
            start = time.perf_counter()
            src = aligned_empty(nbytes // 4, np.float32)
            src.fill(1.0)
            jax.device_put(src).block_until_ready()
            if i:  # the first is a warm-up
                times.append(time.perf_counter() - start)
            del src
        return nbytes / max(min(times) - fill, 1e-3 * min(times))

    to_device_small = rate(sizes.small_transfer_bytes)
    to_device = rate(sizes.transfer_bytes)
    where = transfers.host_copies()
    to_host = _to_host_rate(sizes.transfer_bytes, sizes.repeats,
                            lambda x: transfers.host_view(transfers.to_host(x, where)))
    return to_device, to_device_small, to_host


def _to_host_rate(nbytes: int, repeats: int, read: Callable) -> float:
    """Bytes/s of ``read(device array)``, each time on a fresh array (a JAX array caches its
    host copy)."""
    host = np.ones(nbytes // 4, np.float32)
    times = []
    for i in range(repeats + 1):
        on_device = jax.device_put(host)
        on_device.block_until_ready()
        start = time.perf_counter()
        jax.block_until_ready(read(on_device))
        if i:  # the first is a warm-up
            times.append(time.perf_counter() - start)
        del on_device
    return nbytes / min(times)


def link_rates(nbytes: int = 128 * _MIB, repeats: int = 3) -> tuple[float, float, float]:
    """The link between host memory and the default device, bytes/s: a `pinned_host` array
    to the device, a device array to `pinned_host` memory (what the engine's copies cost at
    best, the floor of an out-of-core epoch's transfers), and JAX's copy of a device array
    into pageable memory (``np.asarray``). On the CPU backend all three are host copies."""
    pinned = transfers.pinned_host()
    host = np.ones(nbytes // 4, np.float32)
    if pinned is None:  # no page-locked kind: the pageable rates are the link's
        src, to_pinned = host, (lambda x: np.asarray(x))
    else:
        src, to_pinned = jax.device_put(host, pinned), (lambda x: jax.device_put(x, pinned))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])  # its default memory
    to_device = _best_rate(nbytes, lambda: jax.device_put(src, device).block_until_ready(),
                           repeats)
    return (to_device, _to_host_rate(nbytes, repeats, to_pinned),
            _to_host_rate(nbytes, repeats, np.asarray))


# -- SSD -------------------------------------------------------------------------------------

def ssd_rates(directory: str | os.PathLike, nbytes: int = 256 * _MIB) -> tuple[float, float]:
    """Sequential read and write bytes/s of the disk holding ``directory``, the page cache
    out of the way (the profile's SSD figures alone, for a benchmark's floor); its file is
    removed whatever happens."""
    sizes = dataclasses.replace(_FULL, ssd_bytes=nbytes, repeats=2)
    fd, name = _make_file(_check_directory(directory))
    try:
        write = _ssd_write(fd, sizes, np.random.default_rng(0))
        with _UncachedReader(name, sizes.chunk) as reader:
            read = max(nbytes / reader.read(nbytes) for _ in range(sizes.repeats))
    finally:
        os.close(fd)
        pathlib.Path(name).unlink(missing_ok=True)
    return read, write


def _make_file(root: pathlib.Path) -> tuple[int, str]:
    try:
        return tempfile.mkstemp(dir=root, prefix=".jgrind-profile-", suffix=".tmp")
    except OSError as err:
        raise ProfileError(f"cannot create a file in {root} ({err.strerror}); pass a directory "
                           "you can write to (--store)") from None


def _ssd_write(fd: int, sizes: _Sizes, rng: np.random.Generator) -> float:
    """Sequential ``os.write`` of the whole file in chunks, then fsync: the time until the data
    is on the disk. Random bytes, so that a compressing or deduplicating layer cannot cheat.
    The file is rewritten from empty each repeat; the last one stays for the reads."""
    chunk = rng.bytes(sizes.chunk)
    times = []
    for _ in range(min(3, sizes.repeats)):
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.fsync(fd)
        start = time.perf_counter()
        for _ in range(sizes.ssd_bytes // sizes.chunk):
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
        times.append(time.perf_counter() - start)
    return sizes.ssd_bytes / min(times)


def _page_cache(fd: int, name: str, sizes: _Sizes,
                rng: np.random.Generator) -> tuple[float, float, float]:
    """Write, read and 4 KiB reads of a file the OS page cache holds: what the SSD tier costs
    while its files fit in the RAM the budgets leave free (the engine reads and writes
    through the page cache).

    The rates are taken as the SSD tier moves data: `SPAN_PIECE_BYTES` bytes per call through
    one reused buffer (its row spans go through a per-thread scratch buffer in pieces of that
    size; blocks are MiBs), and writes over pages the cache already holds (from its
    second epoch on the engine rewrites the same files; its scatter-adds rewrite pages they
    have just read). Smaller calls would fold the per-call cost into the rate, which the cost
    model charges separately (``cached_latency``): 64 KiB reads ran at ~10 GB/s here against
    ~18 GB/s in 1 MiB pieces, and writes that first allocate their pages ran at 5-6 GB/s
    against 10-17 GB/s over cached ones (docs/results-history.md, section 7)."""
    piece = np.frombuffer(rng.bytes(SPAN_PIECE_BYTES), np.uint8)
    pieces = sizes.ssd_bytes // SPAN_PIECE_BYTES
    for i in range(pieces):  # the file's pages into the cache (dirty, as the engine's are)
        os.pwrite(fd, piece, i * SPAN_PIECE_BYTES)

    def write() -> None:
        for i in range(pieces):
            os.pwrite(fd, piece, i * SPAN_PIECE_BYTES)

    write_bw = _best_rate(pieces * SPAN_PIECE_BYTES, write, sizes.repeats)
    reader = os.open(name, os.O_RDONLY)
    buffer = np.empty(SPAN_PIECE_BYTES, np.uint8)
    try:
        def read() -> None:
            for i in range(pieces):
                os.preadv(reader, [buffer], i * SPAN_PIECE_BYTES)

        read_bw = _best_rate(pieces * SPAN_PIECE_BYTES, read, sizes.repeats)
        pages = pieces * SPAN_PIECE_BYTES // _PAGE
        offsets = rng.choice(pages, min(pages, sizes.random_reads), replace=False) * _PAGE
        page = np.empty(_PAGE, np.uint8)
        start = time.perf_counter()
        for offset in offsets:
            os.preadv(reader, [page], int(offset))
        latency = (time.perf_counter() - start) / max(1, offsets.size)
    finally:
        os.close(reader)
    return write_bw, read_bw, latency


def _row_call_overheads(fd: int, sizes: _Sizes, cached_latency: float) -> tuple[float, float]:
    """Seconds per call, beyond the system calls, of the work the SSD tier does for each span
    of rows (`jgrind.engine.ssd`, `SSDFile.read_rows` / `add_rows`, natively where the kernels
    build): the read into a reused scratch buffer and a copy of the wanted rows into the
    output; or the read, an addition and the write back. Measured on a page-cached file with
    one-row spans of a 256-wide float32 table, so the I/O is minimal. Natively, the loops
    check each row read against its checksum and record the new one after an addition, as the
    SSD tier's do."""
    row = 256 * 4
    rows = min(4000, sizes.ssd_bytes // row // 4)
    offsets = np.arange(rows, dtype=np.int64) * 4 * row
    values = np.ones((rows, 256), np.float32)
    out = np.empty((rows, 256), np.float32)
    scratch = np.empty((1, 256), np.float32)
    pick = np.zeros(1, np.int64)

    lib = _kernels.library()
    if lib is not None:  # the native span loops (`jgrind/_kernels/spans.cc`), one row a span
        span_rows = offsets // row  # kept alive: the kernel reads it through a pointer
        spans = (fd, 0, 4 * rows, 256, span_rows.ctypes.data, rows, 0)
        stats = np.zeros(6, np.int64)
        held = np.empty((4 * rows, 256), np.float32)
        os.preadv(fd, [held], 0)
        crcs = row_checksums(held)  # the file's rows as they are: every check passes
        del held

        def checked(rc: int) -> None:  # a failed call would time nothing
            if rc != 0:
                raise RuntimeError(f"row-span timing: the native span loop failed ({rc})")

        def read() -> None:
            checked(lib.jgrind_read_spans_f32(*spans, out.ctypes.data, rows, None,
                                              scratch.ctypes.data, 1, None, crcs.ctypes.data,
                                              stats.ctypes.data))

        def update() -> None:
            checked(lib.jgrind_add_spans_f32(*spans, values.ctypes.data, rows, None,
                                             scratch.ctypes.data, 1, None, crcs.ctypes.data,
                                             stats.ctypes.data))
    else:  # the Python loops the SSD tier falls back to
        def read() -> None:
            for i in range(rows):
                buf = scratch[:1]
                os.preadv(fd, [buf], int(offsets[i]))
                buf.take(pick, axis=0, out=out[i:i + 1], mode="clip")

        def update() -> None:
            with np.errstate(all="ignore"):  # the file holds random bytes, not numbers
                for i in range(rows):
                    buf = scratch[:1]
                    os.preadv(fd, [buf], int(offsets[i]))
                    add_rows(buf, pick, values[i:i + 1])
                    os.pwritev(fd, [buf], int(offsets[i]))

    read_seconds = rows * row / _best_rate(rows * row, read, sizes.repeats)
    update_seconds = rows * row / _best_rate(rows * row, update, sizes.repeats)
    return (max(read_seconds / rows - cached_latency, 0.0),
            max(update_seconds / rows - 2 * cached_latency, 0.0))


class _UncachedReader:
    """Reads a file with the page cache out of the way: ``O_DIRECT`` (into a page-aligned
    buffer) when the filesystem accepts it, else buffered reads after evicting the file with
    ``posix_fadvise(DONTNEED)`` before every pass."""

    def __init__(self, name: str, chunk: int):
        self.name = name
        self.chunk = chunk
        self.buffer = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT requires
        self.fd, self.direct = self._open()

    def _open(self) -> tuple[int, bool]:
        flag = getattr(os, "O_DIRECT", 0)
        if flag:
            try:
                fd = os.open(self.name, os.O_RDONLY | flag)
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise
            else:
                try:
                    with memoryview(self.buffer) as view:
                        os.preadv(fd, [view[:_PAGE]], 0)  # some filesystems refuse only here
                    return fd, True
                except OSError as err:
                    os.close(fd)
                    if err.errno != errno.EINVAL:
                        raise
        return os.open(self.name, os.O_RDONLY), False

    def evict(self) -> None:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def read(self, nbytes: int) -> float:
        """Seconds to read the first ``nbytes`` (a multiple of the chunk) sequentially."""
        self.evict()
        with memoryview(self.buffer) as view:
            start = time.perf_counter()
            offset = 0
            while offset < nbytes:
                got = os.preadv(self.fd, [view], offset)
                if got <= 0:
                    raise ProfileError(f"{self.name} ended early at byte {offset}")
                offset += got
            return time.perf_counter() - start

    def random_latency(self, reads: int, repeats: int, rng: np.random.Generator) -> float:
        """Median over repeats of the mean seconds per 4 KiB read at distinct random aligned
        offsets (readahead off, so that one read does not bring in the next)."""
        pages = os.fstat(self.fd).st_size // _PAGE
        offsets = rng.choice(pages, min(pages, reads * repeats), replace=False) * _PAGE
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
        batches = []
        with memoryview(self.buffer) as view:
            page = view[:_PAGE]
            for batch in np.array_split(offsets, repeats):
                self.evict()
                start = time.perf_counter()
                for offset in batch:
                    os.preadv(self.fd, [page], int(offset))
                batches.append((time.perf_counter() - start) / max(1, batch.size))
            page.release()
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return statistics.median(batches)

    def __enter__(self) -> "_UncachedReader":
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)
        self.buffer.close()


def _on_thread(work: Callable[[], None], n: int) -> Callable[[], None]:
    """Start ``n`` calls of ``work`` on a new thread; returns a join that re-raises its error."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(n):
                work()
        except BaseException as err:  # noqa: BLE001 - re-raised by join()
            failure.append(err)

    thread = threading.Thread(target=run, name="jgrind-profile-io", daemon=True)
    thread.start()

    def join() -> None:
        thread.join()
        if failure:
            raise failure[0]
    return join


def _timed_on_thread(work: Callable[[], None], n: int) -> float:
    """Seconds of ``n`` calls of ``work`` on a new thread, counted from before the thread
    starts: the thread may be done before its starter gets the join, and a join timed alone
    took next to nothing, so that call counts sized by it came out in the thousands and one
    measurement took tens of seconds on a loaded machine."""
    start = time.perf_counter()
    _on_thread(work, n)()
    return time.perf_counter() - start


def _io_parallel(step: Callable, x, step_seconds: float, overlap: float, sizes: _Sizes,
                 rng: np.random.Generator) -> float:
    """The share of the store's reads and writes that run side by side, as the cost model
    uses it (`jgrind.plan.cost.Sweep`: ``io = r + w - io_parallel * min(r, w)``, then
    ``c + io - overlap * min(c, io)``).

    In a sweep the engine reads the next partition's rows on its prefetch thread while its
    writer thread stores or scatter-adds the last partition's output, and the step computes
    on the main thread: three activities on the machine's cores. So this times all three at
    once: a row gather (`take_rows`) on a thread (``r`` seconds alone), a scatter-add
    (`add_rows`) on another (``w`` alone, about as long), and a jitted matmul chain of about
    ``r + w`` seconds (``c``) on this thread, and solves the model for ``io_parallel``: the
    value with which the sweep formula, at the measured ``overlap``, gives the measured
    time. Median over repeats, clamped to [0, 1]. Measured without the compute, two threads
    on two cores ran side by side almost fully (0.79 here), which the engine's sweeps do not
    get."""
    rows, width, picked = sizes.gather
    source, target = np.ones((rows, width), np.float32), np.zeros((rows, width), np.float32)
    idx = np.sort(rng.choice(rows, picked, replace=False))
    out, values = np.empty((picked, width), np.float32), np.ones((picked, width), np.float32)

    def gather() -> None:
        take_rows(source, idx, out=out)

    def scatter_add() -> None:
        add_rows(target, idx, values)

    def calls(work) -> int:
        _on_thread(work, 1)()  # warm: the tables' pages
        once = _timed_on_thread(work, 1)
        return max(1, round(sizes.overlap_seconds / max(once, 1e-9)))

    n_r, n_w = calls(gather), calls(scatter_add)
    shares = []
    for _ in range(sizes.repeats):
        r = _timed_on_thread(gather, n_r)
        w = _timed_on_thread(scatter_add, n_w)
        n_c = max(1, round((r + w) / step_seconds))
        c = _time_chain(step, x, n_c)
        start = time.perf_counter()
        joins = (_on_thread(gather, n_r), _on_thread(scatter_add, n_w))
        _time_chain(step, x, n_c)
        for join in joins:
            join()
        both = time.perf_counter() - start
        # invert c + io - overlap * min(c, io) for io, then io = r + w - p * min(r, w) for p
        io = (both - c) / max(1.0 - overlap, 1e-9) if both - c < (1.0 - overlap) * c \
            else both - (1.0 - overlap) * c
        shares.append((r + w - io) / max(min(r, w), 1e-9))
    return min(1.0, max(0.0, statistics.median(shares)))


def _overlap(step: Callable, x, step_seconds: float, sizes: _Sizes,
             rng: np.random.Generator) -> float:
    """The share of the store's data movement that a concurrent compute step hides.

    The engine moves data on background threads while a partition step runs. On this backend
    nearly all of it is CPU work: row gathers and scatter-adds, copies out of the page cache
    (the SSD tier reads through it), checksums. So the moving is measured as the store does it,
    a row gather (`jgrind.hostio.rows.take_rows`) on a thread. Times a jitted matmul chain alone
    (``t_c``), the gathers alone on a thread (``t_io``, about as long), and both at once
    (``t_both``, compute on this thread): ``clamp((t_c + t_io - t_both) / min(t_c, t_io),
    0, 1)``, median over repeats. 1 means the moving costs nothing while compute runs; 0 that
    the two take turns (the cores are shared). A DMA transfer (an SSD read with O_DIRECT, a GPU
    copy) hides better than this; the engine's reads go through the page cache.
    """
    rows, width, picked = sizes.gather
    table = np.ones((rows, width), np.float32)
    idx = np.sort(rng.choice(rows, picked, replace=False))
    out = np.empty((picked, width), np.float32)

    def gathers(n: int) -> Callable[[], None]:
        return _on_thread(lambda: take_rows(table, idx, out=out), n)

    gathers(1)()  # warm: the table's and the output's pages
    start = time.perf_counter()
    gathers(1)()
    once = time.perf_counter() - start
    n = max(1, round(sizes.overlap_seconds / max(once, 1e-9)))
    shares = []
    for _ in range(sizes.repeats):
        start = time.perf_counter()
        gathers(n)()
        t_io = time.perf_counter() - start
        calls = max(1, round(t_io / step_seconds))
        t_c = _time_chain(step, x, calls)
        start = time.perf_counter()
        join = gathers(n)
        _time_chain(step, x, calls)
        join()
        t_both = time.perf_counter() - start
        shares.append((t_c + t_io - t_both) / max(min(t_c, t_io), 1e-9))
    return min(1.0, max(0.0, statistics.median(shares)))
