"""Why backward sweeps that scatter-add into an SSD gradient run under their price (issue 42):
every partition's input gradient added into ``G_l`` alone on the main thread, its bytes and
calls beside the ones the cost model prices.

    python tools/bench_accumulate.py --config host-tight --parts 256

On a planner configuration (`harness.CONFIGS`) with ``ssd_offload`` at ``--parts`` partitions:
``--epochs`` epochs after a compiling one, each backward sweep's seconds and its writer
thread's seconds beside the model's. Then, for every layer with a gradient, a fresh ``G_l``
(as the engine makes it: the file kept from the epoch, zeroed lazily) gets every partition's
padded input gradient added, as the backward sweep's writer adds it, three times; the best
pass's seconds, and the SSD calls and file bytes it made (`jgrind.engine.store.Accounts`),
beside the model's price of the same adds (`jgrind.plan.cost.accumulate_parts`) and the
bytes and calls it assumes. The model prices every span as read and written whole, at the
profile's page-cache rates where the store's files fit in free RAM (`page_cached`).
``--gaps``: the same adds with the engine's coalescing gap set to each of these sizes, their
seconds fitted to the calls and bytes they made. Last, the native span loops alone on a
synthetic page-cached file (`probe_span_loops`), beside the same prices.
"""

from __future__ import annotations

import argparse

import harness
from harness import CONFIGS, build_config, planner_config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=[c.name for c in CONFIGS], default="host-tight")
    harness.add_parts(p, 256)
    harness.add_epochs(p, 2)
    harness.add_store(p)
    p.add_argument("--profile", help="a saved hardware profile (default: this machine's)")
    p.add_argument("--gaps", default="2,4,16,64,256",
                   help="coalescing gaps (KiB) to run the adds at besides the engine's, for a "
                        "fit of their seconds to calls and bytes")
    args = p.parse_args()

    import numpy as np
    import optax

    from jgrind.engine import OutOfCore, ssd
    from jgrind.plan import policies
    from jgrind.plan import profile as hw
    from jgrind.plan.cost import (COALESCE_BYTES, ITEMSIZE, S, Assignment, accumulate_parts, memory,
                                  page_cached, ssd_span_reads, with_page_cache)
    from jgrind.plan.measure import _best_seconds  # the profile's own timer
    cfg = planner_config(args.config)
    graph, model = build_config(cfg)
    profile = hw.load(args.profile) if args.profile else hw.load_current(args.store)
    if profile is None:
        raise SystemExit("no current hardware profile for this store: run `jgrind profile "
                         f"--store {args.store}` first, or pass --profile")
    optimizer = optax.adam(1e-3)
    ex = OutOfCore(graph, model, optimizer, policy=policies.ssd_offload(args.store),
                   num_parts=args.parts, store=args.store, device_budget=cfg.device_budget,
                   host_budget=cfg.host_budget)
    sweeps = harness.PricedSweeps(ex, model, graph, optimizer, profile)
    pred = sweeps.prediction
    for e, label, seconds, measured, price in sweeps.epochs(args.epochs):
        if label.startswith("backward"):
            written = sum(measured.get("writes", {}).values())
            print(f"epoch {e} {label}: {seconds:.3f} s (priced {pred.sweep_seconds(price):.3f}); "
                  f"its writes {written:.3f} s (priced {price.writes:.3f})", flush=True)

    w, built, store = ex.workload, ex.built, ex.store
    a = Assignment.from_fates(ex.fates, w.num_layers, w.num_parts)
    cached = page_cached(profile, memory(w, a))
    rates = with_page_cache(profile, cached)
    print(f"SSD priced at the {'page cache' if cached else 'disk'}'s rates: read "
          f"{rates.ssd_read_bw / 1e9:.2f} GB/s, write {rates.ssd_write_bw / 1e9:.2f} GB/s, "
          f"{rates.ssd_latency * 1e6:.1f} us a call", flush=True)
    rng = np.random.default_rng(0)
    for layer in range(1, w.num_layers):
        if w.local(layer):
            continue
        codes = a.gradients[layer]
        width = w.widths[layer]
        values = {part.index: rng.standard_normal((int(w.pad_in[part.index]), width),
                                                  dtype=np.float32) for part in built.parts}
        counted = {}

        def add_all():
            table = ex.runner.gradient_table(layer)
            before = dict(vars(store.accounts))
            for part in built.parts:
                table.accumulate(part.index, part.halo_owner, part.halo_row,
                                 values[part.index])
            after = vars(store.accounts)
            counted.update({k: after[k] - before[k] for k in
                            ("ssd_read_ops", "ssd_write_ops", "ssd_file_read",
                             "ssd_file_written")})
            store.drop(table, keep=True)  # as the engine keeps an all-SSD gradient file
        seconds = _best_seconds(add_all, 3)
        price = accumulate_parts(w, rates, layer, codes).sum()
        in_ssd = codes == S
        calls, span_rows = ssd_span_reads(w, width, in_ssd, with_own=True)
        own = np.where(in_ssd, w.owned, 0)
        span = int(span_rows.sum()) * width * ITEMSIZE
        priced_calls = int(calls.sum())
        print(f"G_{layer} ({width} wide, {int(in_ssd.sum())} of {w.num_parts} blocks on SSD): "
              f"every partition's adds alone {seconds:.3f} s, priced {price:.3f} s", flush=True)
        print(f"  made {counted['ssd_read_ops']:,} reads and {counted['ssd_write_ops']:,} "
              f"writes, {counted['ssd_file_read'] / 2**20:.1f} MiB read and "
              f"{counted['ssd_file_written'] / 2**20:.1f} MiB written; priced "
              f"{priced_calls:,} of each, {span / 2**20:.1f} MiB each way", flush=True)
        rows = int((w.halo_rows_in(in_ssd) + own).sum())
        others = price - (span / rates.ssd_read_bw + span / rates.ssd_write_bw
                          + priced_calls * (2 * rates.ssd_latency + rates.update_call_overhead))
        made_bytes = (counted["ssd_file_read"] / rates.ssd_read_bw
                      + counted["ssd_file_written"] / rates.ssd_write_bw)
        calls_made = counted["ssd_read_ops"] + counted["ssd_write_ops"]
        print(f"  priced: the bytes {span / rates.ssd_read_bw + span / rates.ssd_write_bw:.3f} s, "
              f"the calls {priced_calls * (2 * rates.ssd_latency + rates.update_call_overhead):.3f} s "
              f"({(rates.ssd_latency + rates.update_call_overhead / 2) * 1e6:.2f} us each), the "
              f"rest (copies of {rows:,} rows) {others:.3f} s; the bytes made at the priced "
              f"rates {made_bytes:.3f} s, which leaves "
              f"{(seconds - made_bytes - others) / max(calls_made, 1) * 1e6:.2f} us a call made",
              flush=True)
        runs = []
        for gap in [int(g) << 10 for g in args.gaps.split(",") if g] + [COALESCE_BYTES]:
            ssd.COALESCE_BYTES = gap
            try:
                took = _best_seconds(add_all, 3)
            finally:
                ssd.COALESCE_BYTES = COALESCE_BYTES
            runs.append((gap, took, counted["ssd_read_ops"] + counted["ssd_write_ops"],
                         counted["ssd_file_read"] + counted["ssd_file_written"]))
            print(f"  gap {gap >> 10:4d} KiB: {took:.3f} s, {runs[-1][2]:,} calls, "
                  f"{runs[-1][3] / 2**20:,.1f} MiB moved", flush=True)
        if len(runs) >= 3:
            design = np.array([[1.0, calls, moved] for _, _, calls, moved in runs])
            (rest, per_call, per_byte), *_ = np.linalg.lstsq(
                design, np.array([took for _, took, _, _ in runs]), rcond=None)
            fitted = design @ np.array([rest, per_call, per_byte])
            worst = max(abs(f / t - 1) for f, (_, t, _, _) in zip(fitted, runs))
            print(f"  fitted over the gaps: {per_call * 1e6:.2f} us a call (read or write; "
                  f"priced {(rates.ssd_latency + rates.update_call_overhead / 2) * 1e6:.2f}), "
                  f"{1 / per_byte / 1e9 if per_byte > 0 else float('inf'):.2f} GB/s a byte moved "
                  f"either way (priced {2 / (1 / rates.ssd_read_bw + 1 / rates.ssd_write_bw) / 1e9:.2f}), "
                  f"{rest:.3f} s the rest (priced {others:.3f}); the fit within "
                  f"{100 * worst:.0f} % of every run", flush=True)
    ex.close()
    probe_span_loops(args.store, rates)


def probe_span_loops(directory: str, profile) -> None:
    """The native span loops alone (`jgrind/_kernels/spans.cc`) on a page-cached 256 MiB file
    of 128-wide rows: 4,000 spans of ``span`` rows of which ``wanted`` are read or added,
    seconds a span beside the price of the profile's page-cache figures."""
    import os
    import tempfile

    import numpy as np

    from jgrind import _kernels
    from jgrind.hostio.checksum import row_checksums
    from jgrind.plan.measure import _best_seconds
    lib = _kernels.library()
    if lib is None:
        print("span loops: the native kernels did not build; nothing to probe")
        return
    width, row = 128, 512
    total = (256 << 20) // row
    fd, name = tempfile.mkstemp(dir=directory, prefix="span-probe-")
    try:
        held = np.random.default_rng(0).standard_normal((total, width), dtype=np.float32)
        os.pwritev(fd, [held], 0)
        crcs = row_checksums(held)
        del held
        latency, read_bw, write_bw = (profile.cached_latency, profile.cached_read_bw,
                                      profile.cached_write_bw)
        scratch = np.empty(((1 << 20) // row, width), np.float32)
        stats = np.zeros(6, np.int64)
        for span, wanted in ((1, 1), (2, 2), (8, 2), (16, 2), (32, 2), (32, 8), (32, 32)):
            spans = 4000
            pick = np.unique(np.linspace(0, span - 1, wanted).astype(np.int64))
            rows = (np.arange(spans, dtype=np.int64)[:, None] * (span + 40) + pick).reshape(-1)
            values = np.ones((rows.size, width), np.float32)
            out = np.empty_like(values)
            common = (fd, 0, total, width, rows.ctypes.data, rows.size, 32)
            tail = (None, scratch.ctypes.data, scratch.shape[0], None, crcs.ctypes.data,
                    stats.ctypes.data)

            def update():
                if lib.jgrind_add_spans_f32(*common, values.ctypes.data, rows.size, *tail):
                    raise RuntimeError("the native read-add-write loop failed")

            def read():
                if lib.jgrind_read_spans_f32(*common, out.ctypes.data, rows.size, *tail):
                    raise RuntimeError("the native read loop failed")
            added = _best_seconds(update, 5) / spans
            taken = _best_seconds(read, 5) / spans
            nbytes = span * row
            print(f"span loops, {span:2d} rows a span, {pick.size:2d} wanted: read-add-write "
                  f"{added * 1e6:6.2f} us (priced "
                  f"{(2 * latency + nbytes / read_bw + nbytes / write_bw) * 1e6:6.2f}), read "
                  f"{taken * 1e6:6.2f} us (priced {(latency + nbytes / read_bw) * 1e6:6.2f})",
                  flush=True)
    finally:
        os.close(fd)
        os.remove(name)


if __name__ == "__main__":
    main()
