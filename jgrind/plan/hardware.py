"""A hardware profile's record: the figures the planner predicts epoch time from, their checks,
and the machine they describe.

`Profile` is plain data. `jgrind.plan.measure` measures one; `jgrind.plan.profile` keeps one
as a file and decides when to measure again (`why_stale`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import socket
from typing import Any, Optional

from jgrind.hostio import allocator, host_memory
from jgrind.hostio.rows import threads as row_threads

PROFILE_VERSION = 27  # 2: page-cache figures; 3: per-call overheads of row I/O;
#                      4: gathers into the output buffer, scatter-add rate;
#                      5: host -> device rate at two transfer sizes;
#                      6: scatter-adds through `jgrind.hostio.rows` (take, add, store), not `x[i] += v`
#                      7: host -> device from aligned buffers (`jgrind.hostio.buffers`), as the store
#                         hands them over: adopted in place on the CPU backend
#                      8: a whole-graph training step, which calibrates the fast path
#                      9: the checksum rate (the SSD tier's CRC32 of every block); the
#                         overlap of a row gather (not an O_DIRECT read) with compute; span
#                         calls measured as the SSD tier's loop runs them (scratch reused)
#                     10: the weight-gradient contraction with a narrow output
#                     11: reads beside writes (`io_parallel`)
#                     12: page-cache rates in pieces of the SSD tier's size
#                         (`jgrind.plan.cost.SPAN_PIECE_BYTES`) through one reused buffer,
#                         writes over cached pages: as the SSD tier moves its spans
#                     13: native row gathers and scatter-adds (`jgrind.hostio.rows`), timed at two
#                         row widths for a per-row cost beside the per-byte rate; the step
#                         latency of a call with as many arguments as a layer step has
#                     14: dense products at the layers' precision (`jgrind.models.matmul`:
#                         full float32 on every backend; a GPU's default was TF32)
#                     15: the checksum is `jgrind.hostio.checksum` (CRC32C with the CPU's
#                         instruction, ~3x zlib's CRC-32 on the test machine); row-span
#                         calls timed in the native loops (`jgrind/_kernels/spans.cc`)
#                     16: device -> host as the engine copies step outputs
#                         (`jgrind.hostio.transfers`: through `pinned_host` memory off the CPU
#                         backend); the link's own rates both ways, from and to
#                         `pinned_host` memory, and JAX's copy into pageable memory
#                     17: row-span calls check and record each row's checksum, as the SSD
#                         tier's loops do (`jgrind.engine.ssd`: a CRC32C per file row)
#                     18: the sweep step (`sweep_step`): what the engine's pipeline costs a
#                         partition step beyond its compute and I/O
#                     19: the storage dtypes' encode and decode rates (`codec_bw`)
#                     20: a device-tier call (`device_call`): a block write, a row take read
#                         back, a row add, as `jgrind.engine.tiers.device` makes them
#                     21: a halo owner served through the host cache (`cached_take`,
#                         `cache_lookup`), as `jgrind.engine.tiers.cached_ssd` serves them
#                     22: the device-tier call on a table of a layer's width and length
#                         (`jgrind.plan.measure.DEVICE_CALL_ROWS`), which XLA splits across
#                         threads as it does the engine's, not an 8-wide one it runs on one
#                     23: the engine's own cost per partition step (`machinery_*`), measured by
#                         running it (`jgrind.engine.machinery`): a sweep's lower bound
#                     24: what a gather or a scatter-add of halo rows costs the engine when
#                         its table has blocks both on the device and off it
#                         (`machinery_device_mix`)
#                     25: the engine's own cost per step of a layer that keeps its
#                         aggregation (`machinery_kept_*`): a forward that stores two outputs,
#                         a backward from the kept aggregation
#                     26: the sparse product on a partition step's block too
#                         (`spmm_cached_rate`): its input often fits in the caches, the
#                         200k-row probe's does not
#                     27: the loader's and the writer's own seconds per step
#                         (`machinery_loader`, `machinery_writer`): an I/O thread's time is
#                         that and its bytes

_MIB = 2**20


class ProfileError(ValueError):
    """A profile file is unreadable or malformed, or the directory to measure cannot be used."""


class OlderProfileError(ProfileError):
    """A profile file written by another version of the format (its fields differ)."""


_FLOAT_FIELDS = ("matmul_flops", "spmm_rate", "step_latency", "sweep_step", "gather_bw",
                 "scatter_add_bw",
                 "gather_row_seconds", "scatter_add_row_seconds",
                 "copy_bw", "to_device_bw", "to_device_small_bw", "to_host_bw", "ssd_read_bw",
                 "ssd_write_bw",
                 "ssd_latency",
                 "cached_read_bw", "cached_write_bw", "cached_latency", "read_call_overhead",
                 "update_call_overhead", "overlap", "io_parallel", "checksum_bw",
                 "contraction_bw", "link_to_device_bw", "link_to_host_bw",
                 "pageable_to_host_bw", "device_call", "cached_take", "cache_lookup",
                 "machinery_forward", "machinery_top", "machinery_backward",
                 "machinery_params", "machinery_ssd_call", "machinery_device_mix",
                 "machinery_kept_forward", "machinery_kept_backward", "machinery_kept_params",
                 "machinery_loader", "machinery_writer", "spmm_cached_rate")
_INT_FIELDS = ("device_free", "host_free", "ssd_free", "to_device_bytes",
               "to_device_small_bytes", "spmm_bytes", "spmm_cached_bytes")


@dataclasses.dataclass(frozen=True)
class Profile:
    """What this machine does per second, as the planner's cost model needs it.

    Rates are per second, latencies in seconds, sizes in bytes. ``overlap`` is the share of a
    transfer's time that a concurrent compute step hides (1: transfers are free while compute
    runs; 0: they add up), measured by running a host row gather (as the store moves data)
    and a jitted matmul together.
    The ``*_free`` figures are a snapshot at measurement time, for defaults only: the planner
    should check current free space itself before it commits to a plan.
    """

    version: int
    machine: dict          # `machine_fingerprint()` of the machine it was measured on
    created: str           # ISO-8601 UTC timestamp
    matmul_flops: float    # dense float32 matmul on the default device, flop/s (2*m*k*n each)
    contraction_bw: float  # jitted ``x.T @ g`` over many rows with a narrow ``g`` (a weight
    #                        gradient into few outputs), bytes of ``x`` and ``g`` per second
    spmm_rate: float       # jitted `jgrind.sparse.spmm`, nonzeros * width per second, on an
    #                        input of `spmm_bytes` (one the caches do not hold)
    step_latency: float    # seconds per dispatch + sync of a jitted call with a layer step's
    #                        number of array arguments
    sweep_step: float      # seconds per partition step of a pipelined sweep with no data to
    #                        move or compute: thread hand-offs, puts, dispatch, waits
    #                        (`jgrind.plan.measure._sweep_step`); the cost model charges it
    #                        per step instead of ``step_latency``
    gather_bw: float       # host `jgrind.hostio.rows.take_rows` of sorted random rows into scattered
    #                        output rows (as the store places halo rows), bytes/s beyond the
    #                        per-row cost
    gather_row_seconds: float  # ... and seconds per row beyond the bytes (from two widths)
    scatter_add_bw: float  # host `jgrind.hostio.rows.add_rows` of sorted random unique rows, bytes/s
    scatter_add_row_seconds: float  # ... and seconds per row beyond the bytes
    copy_bw: float         # host `np.copyto` of a large array, bytes/s
    to_device_bw: float    # a fresh store buffer filled and handed to the device (`jax.device_put`),
    #                        beyond the fill itself, bytes/s, of a large array
    to_device_small_bw: float  # the same for a partition-sized array (the rate depends on size:
    #                            on the CPU backend large buffers are freshly mapped pages)
    to_device_bytes: int       # the sizes the two rates were measured at
    to_device_small_bytes: int
    to_host_bw: float      # a step output read on the host as the engine does it
    #                        (`jgrind.hostio.transfers`), bytes/s (a view on the CPU backend)
    link_to_device_bw: float  # a `pinned_host` array to the device: the link's rate, bytes/s
    link_to_host_bw: float    # a device array to `pinned_host` memory, bytes/s
    pageable_to_host_bw: float  # `np.asarray(device array)`: JAX's copy into pageable memory
    ssd_read_bw: float     # sequential read, page cache out of the way, bytes/s
    ssd_write_bw: float    # sequential write + fsync, bytes/s
    ssd_latency: float     # seconds per random 4 KiB read, page cache out of the way
    cached_read_bw: float  # reads of a file held in the OS page cache, 1 MiB per call, bytes/s
    cached_write_bw: float  # buffered writes (no fsync) over pages the cache holds, bytes/s
    cached_latency: float  # seconds per 4 KiB read served by the page cache (a system call)
    read_call_overhead: float    # seconds of Python/NumPy work per row-span read, beyond I/O
    update_call_overhead: float  # the same per read-add-write of a row span (scatter-adds)
    overlap: float         # latency-hiding factor in [0, 1]
    io_parallel: float     # share of a sweep's reads (prefetch thread) and writes (writer
    #                        thread) that run side by side, measured beside compute, in [0, 1]
    checksum_bw: float     # `jgrind.hostio.checksum` of a large array, bytes/s (SSD blocks are checked)
    fused_steps: tuple     # [nodes, edges, seconds] of one jitted whole-graph training step
    #                        of the reference GCN (`jgrind.plan.cost.FUSED_REFERENCE`) on
    #                        generated graphs of two sizes, fastest of the repeats
    device_free: int       # bytes free on the default device (host RAM on the CPU backend)
    host_free: int         # available host RAM, bytes (within a cgroup's limit: `host_memory`)
    ssd_free: int          # free bytes on the disk of `directory`
    directory: str         # where the SSD figures were measured (absolute)
    # {codec name: (encode, decode)}: float32 bytes a lossy storage dtype converts per second
    # (`jgrind.hostio.codecs.conversion_rates`); empty in profiles made by hand
    codec_bw: dict = dataclasses.field(default_factory=dict)
    # seconds per call of the device tier (`jgrind.engine.tiers.device`: a block written into
    # the table, rows taken and read back, rows added), each waited for, beyond its bytes; 0
    # in profiles made by hand: the cost model then charges `step_latency` (`device_call_seconds`)
    device_call: float = 0.0
    # seconds per halo owner of a gather through a host cache that cannot hold the layer's SSD
    # file (`jgrind.engine.tiers.cached_ssd`): one whose block the cache holds (a locked
    # lookup, an index shift, a row take), and one it does not (the lookup and a fit check);
    # 0 in profiles made by hand
    cached_take: float = 0.0
    cache_lookup: float = 0.0
    # seconds per partition step that the engine itself takes, measured by running it on a
    # workload with next to no data (`jgrind.engine.machinery`): a forward step, the top
    # layer's fused step, a backward step with an input gradient, the first layer's (weight
    # gradients only), with host blocks; and what each table call on an SSD block adds. A
    # sweep takes at least its steps' sum (`jgrind.plan.cost.Sweep.machinery`). 0 where not
    # measured (profiles made by hand, or measured without the engine): the cost model then
    # charges `sweep_step` per step inside the compute instead
    machinery_forward: float = 0.0
    machinery_top: float = 0.0
    machinery_backward: float = 0.0
    machinery_params: float = 0.0
    machinery_ssd_call: float = 0.0
    # what a step's gather or scatter-add of halo rows adds when its table's blocks are some
    # on the device and some off it (the device tier's takes and adds read back beside the
    # host rows: each waits for the device's queue, where an all-device table's stays there)
    machinery_device_mix: float = 0.0
    # the same per step of a layer that keeps its aggregation (docs/engine.md, "Kept
    # aggregations"): its forward step stores two outputs, its backward steps read the
    # aggregation instead of regathering; 0 where not measured (the figures above then)
    machinery_kept_forward: float = 0.0
    machinery_kept_backward: float = 0.0
    machinery_kept_params: float = 0.0
    # the loader's and the writer's own seconds per step in the same run with host blocks:
    # their calls into the store with next to nothing to move (routes, table calls, the
    # hand-over), which their thread spends besides its bytes (`jgrind.plan.cost.Sweep`);
    # 0 where not measured
    machinery_loader: float = 0.0
    machinery_writer: float = 0.0
    # the sparse product's rate on a partition step's block, whose input (`spmm_cached_bytes`)
    # the caches hold, and the input size `spmm_rate` was measured at (`spmm_bytes`): the
    # product reads its input's rows in the adjacency's random order, so it runs several
    # times faster while they stay in the caches (`jgrind.plan.cost.spmm_rate_at` prices the
    # sizes between); 0 where not measured: then `spmm_rate` at every size
    spmm_cached_rate: float = 0.0
    spmm_bytes: int = 0
    spmm_cached_bytes: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any) -> "Profile":
        """The profile in ``d`` (as written by `to_json`); ProfileError names the first
        missing or bad field. Unknown fields are ignored."""
        if not isinstance(d, dict):
            raise ProfileError(f"expected a JSON object, found {type(d).__name__}")
        values = {}
        for field in dataclasses.fields(cls):
            if field.name not in d and (field.default_factory is not dataclasses.MISSING
                                        or field.default is not dataclasses.MISSING):
                # a field added since with a default (e.g. `codec_bw`): an older profile, such
                # as one saved on a GPU machine for study elsewhere, still reads; its version
                # keeps it stale for `load_or_measure`
                continue
            if field.name not in d:
                raise ProfileError(f"field {field.name!r} is missing")
            values[field.name] = _check_field(field.name, d[field.name])
        return cls(**values)

    def stale_reason(self) -> Optional[str]:
        """None if this profile is current for this machine and this jgrind, else why not, in
        one line ("it was measured on another machine (...)")."""
        why = why_stale(self)
        return None if why is None else f"it {why}"

    def format(self) -> str:
        """A readable table of the figures, with units."""
        m = self.machine
        gib = 2**30
        rows = [
            ("machine", f"{m.get('cpu')!s}, {m.get('cores')} cores, "
                        f"{_num(m.get('ram_bytes')) / gib:.1f} GiB RAM"
                        + (f" (the limit of memory cgroup {m['memory_cgroup']})"
                           if m.get("memory_cgroup") else "")),
            ("jax", f"{m.get('jax')} on {m.get('backend')} ({m.get('device_kind')})"),
            ("glibc huge pages", "on" if m.get("huge_pages") else "off"),
            ("heap reuse", "on" if m.get("heap_reuse") else "off"),
            ("row threads", f"{m.get('row_threads', 1)}"),
            ("dense matmul", f"{self.matmul_flops / 1e9:.1f} GFLOP/s"),
            ("contraction", f"{self.contraction_bw / 1e9:.2f} GB/s (weight gradient, "
                            "narrow output)"),
            ("sparse spmm", f"{self.spmm_rate / 1e9:.2f} G nonzeros*width/s"
                            + (f" at {self.spmm_bytes / 1e6:.1f} MB of input, "
                               f"{self.spmm_cached_rate / 1e9:.2f} at "
                               f"{self.spmm_cached_bytes / 1e6:.1f} MB"
                               if self.spmm_cached_rate else "")),
            ("step latency", f"{self.step_latency * 1e3:.3f} ms"),
            ("sweep step", f"{self.sweep_step * 1e3:.3f} ms (per partition step, beyond "
                           "compute and I/O)"),
            ("engine step", (f"{self.machinery_forward * 1e3:.3f} ms forward, "
                             f"{self.machinery_top * 1e3:.3f} ms top, "
                             f"{self.machinery_backward * 1e3:.3f} ms backward, "
                             f"{self.machinery_params * 1e3:.3f} ms first layer's backward; "
                             f"keeping its aggregation "
                             f"{self.machinery_kept_forward * 1e3:.3f} ms forward, "
                             f"{self.machinery_kept_backward * 1e3:.3f} ms backward, "
                             f"{self.machinery_kept_params * 1e3:.3f} ms first layer's; "
                             f"+{self.machinery_ssd_call * 1e3:.3f} ms per SSD call, "
                             f"+{self.machinery_device_mix * 1e3:.3f} ms per halo call on a "
                             "table split between the device and other tiers "
                             "(the engine's own, per partition step)")
             if self.machinery_forward else "not measured"),
            ("I/O threads' own", f"{self.machinery_loader * 1e3:.3f} ms loader, "
                                 f"{self.machinery_writer * 1e3:.3f} ms writer (per step, "
                                 "besides their bytes)"
             if self.machinery_loader else "not measured"),
            ("device call", f"{self.device_call * 1e3:.3f} ms (a device-tier block write, "
                            "row take or row add)" if self.device_call else "not measured"),
            ("cached halo owner", f"{self.cached_take * 1e6:.1f} us from a cached block, "
                                  f"{self.cache_lookup * 1e6:.1f} us looked up and not there"
             if self.cached_take else "not measured"),
            ("host gather", f"{self.gather_bw / 1e9:.2f} GB/s + "
                            f"{self.gather_row_seconds * 1e9:.1f} ns per row"),
            ("host scatter-add", f"{self.scatter_add_bw / 1e9:.2f} GB/s + "
                                 f"{self.scatter_add_row_seconds * 1e9:.1f} ns per row"),
            ("host copy", f"{self.copy_bw / 1e9:.2f} GB/s"),
            ("checksum", f"{self.checksum_bw / 1e9:.2f} GB/s"),
            ("storage dtypes", ", ".join(f"{k} {e / 1e9:.2f}/{d / 1e9:.2f}"
                                         for k, (e, d) in self.codec_bw.items())
             + " GB/s (encode/decode, float32 bytes)" if self.codec_bw else "not measured"),
            ("host -> device", f"{self.to_device_bw / 1e9:.2f} GB/s at "
                               f"{self.to_device_bytes / _MIB:.0f} MiB, "
                               f"{self.to_device_small_bw / 1e9:.2f} GB/s at "
                               f"{self.to_device_small_bytes / _MIB:.0f} MiB"),
            ("device -> host", f"{self.to_host_bw / 1e9:.2f} GB/s (pageable: "
                               f"{self.pageable_to_host_bw / 1e9:.2f} GB/s)"),
            ("link", f"{self.link_to_device_bw / 1e9:.2f} GB/s to the device, "
                     f"{self.link_to_host_bw / 1e9:.2f} GB/s back (pinned host memory)"),
            ("SSD read", f"{self.ssd_read_bw / 1e9:.2f} GB/s"),
            ("SSD write", f"{self.ssd_write_bw / 1e9:.2f} GB/s"),
            ("SSD 4 KiB read", f"{self.ssd_latency * 1e3:.3f} ms"),
            ("cached read", f"{self.cached_read_bw / 1e9:.2f} GB/s (file in the page cache)"),
            ("cached write", f"{self.cached_write_bw / 1e9:.2f} GB/s (no fsync)"),
            ("cached 4 KiB", f"{self.cached_latency * 1e3:.4f} ms"),
            ("row-span call", f"{self.read_call_overhead * 1e6:.1f} us read, "
                              f"{self.update_call_overhead * 1e6:.1f} us read-add-write "
                              "(beyond the I/O)"),
            ("overlap", f"{self.overlap:.2f} (share of transfer time hidden by compute)"),
            ("reads/writes", f"{self.io_parallel:.2f} (share of the shorter that runs beside "
                             "the longer)"),
            ("whole-graph step", ", ".join(f"{s * 1e3:.1f} ms at {n} nodes, {e} edges"
                                           for n, e, s in self.fused_steps)
             + " (reference GCN)"),
            ("device free", f"{self.device_free / gib:.1f} GiB"),
            ("host free", f"{self.host_free / gib:.1f} GiB"),
            ("SSD free", f"{self.ssd_free / gib:.1f} GiB in {self.directory}"),
        ]
        head = f"hardware profile (version {self.version}, measured {self.created})"
        return "\n".join([head] + [f"  {name:<15} {value}" for name, value in rows])


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def _check_field(name: str, value: Any) -> Any:
    """``value`` if it is a valid ``name``, else ProfileError saying what is wrong."""
    def bad(expected: str) -> ProfileError:
        return ProfileError(f"field {name!r} is {value!r}, expected {expected}")

    is_int = isinstance(value, int) and not isinstance(value, bool)
    if name == "version":
        if not is_int:
            raise bad("an integer")
    elif name == "machine":
        if not isinstance(value, dict):
            raise bad("an object (the machine fingerprint)")
        value = dict(value)
    elif name in ("created", "directory"):
        if not isinstance(value, str) or not value:
            raise bad("a non-empty string")
    elif name in _FLOAT_FIELDS:
        if not (is_int or isinstance(value, float)) or not math.isfinite(value) or value < 0:
            raise bad("a finite non-negative number")
        if name in ("overlap", "io_parallel") and value > 1:
            raise bad("a number in [0, 1]")
        value = float(value)
    elif name == "fused_steps":
        ok = isinstance(value, (list, tuple)) and value and all(
            isinstance(step, (list, tuple)) and len(step) == 3 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and v > 0 for v in step) for step in value)
        if not ok:
            raise bad("a non-empty list of [nodes, edges, seconds], all positive")
        value = tuple((int(n), int(e), float(t)) for n, e, t in value)
    elif name in _INT_FIELDS:
        if not is_int or value < 0:
            raise bad("a non-negative integer (bytes)")
    elif name == "codec_bw":
        ok = isinstance(value, dict) and all(
            isinstance(rates, (list, tuple)) and len(rates) == 2 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                and v > 0 for v in rates) for rates in value.values())
        if not ok:
            raise bad("an object of codec name: [encode, decode] bytes/s, all positive")
        value = {str(k): (float(e), float(d)) for k, (e, d) in value.items()}
    return value


def why_stale(profile: Profile) -> Optional[str]:
    """Why ``profile`` does not describe this machine, as a predicate ("was measured on ..."),
    or None. Hostnames are not compared: containers get a new one every start."""
    if profile.version != PROFILE_VERSION:
        return f"is version {profile.version}; this jgrind writes version {PROFILE_VERSION}"
    then, now = profile.machine, machine_fingerprint()
    hardware = [key for key in ("cpu", "cores") if then.get(key) != now[key]]
    if not abs(_num(then.get("ram_bytes")) - now["ram_bytes"]) <= 0.05 * now["ram_bytes"]:
        hardware.append("ram_bytes")
    # profiles from before heap reuse or row threads existed were measured without them
    then = {"heap_reuse": False, "row_threads": 1, **then}
    software = [key for key in ("jax", "backend", "device_kind", "huge_pages", "heap_reuse",
                                "row_threads")
                if then.get(key) != now[key]]
    reasons = []
    if hardware:
        was, ours = _describe(then), _describe(now)
        reasons.append(f"was measured on another machine ({', '.join(was[k] for k in hardware)}"
                       f"; this one has {', '.join(ours[k] for k in hardware)})")
    if software:
        names = {"jax": "jax", "backend": "backend", "device_kind": "device",
                 "huge_pages": "glibc huge pages", "heap_reuse": "heap reuse",
                 "row_threads": "row threads"}
        switches = ("huge_pages", "heap_reuse")
        shown = lambda k, v: ({True: "on", False: "off"}.get(v, "not recorded")  # noqa: E731
                              if k in switches else repr(v))
        reasons.append("was measured with " + ", ".join(
            f"{names[k]} {shown(k, then.get(k))} (now {shown(k, now[k])})" for k in software))
    return " and ".join(reasons) or None


def _describe(fingerprint: dict) -> dict:
    return {"cpu": f"cpu {fingerprint.get('cpu')!r}", "cores": f"{fingerprint.get('cores')} cores",
            "ram_bytes": f"{_num(fingerprint.get('ram_bytes')) / 2**30:.1f} GiB RAM"}


def machine_fingerprint() -> dict:
    """What identifies the hardware and software a profile was measured with."""
    import jax

    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        # a cgroup's limit where there is one (a container, a Slurm job): the RAM there is
        "ram_bytes": host_memory.total(),
        "memory_cgroup": host_memory.limiting_cgroup(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        # fresh buffers fault in 2 MiB pages instead of 4 KiB ones, or are not fresh at all:
        # every transfer and step rate changes (jgrind.hostio.allocator)
        "huge_pages": allocator.HUGE_PAGES.active(),
        "heap_reuse": allocator.HEAP_REUSE.active(),
        # the store's gathers and scatter-adds, split across threads (jgrind.hostio.rows)
        "row_threads": row_threads(),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
