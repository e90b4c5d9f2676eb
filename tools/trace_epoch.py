"""One out-of-core epoch under `jax.profiler`, and a summary of where its time went.

    python tools/trace_epoch.py --rmat 1000000 10000000 --policy host --parts 8 --trace DIR
    python tools/trace_epoch.py --summarize DIR          # a trace written earlier (any machine)

Runs `jgrind.engine.OutOfCore` normally (loader and writer threads on), counts the programs
compiled and their compile seconds per epoch (JAX's ``/jax/core/compile/backend_compile_duration``
events) and lists them grouped by function name (``--programs``, `jgrind.engine.program_log`),
times ``--epochs`` epochs (with ``--variants``, per variant; an epoch in which a
variant first compiles programs is not timed, and the median line says so), then traces one
more and prints, per plane of the trace (the host, each GPU), each line's busy time (the union
of its events' intervals, so nested events count once), its share of the traced window, and its
heaviest event names. On a GPU the lines are its streams: kernels, and the copy engines'
host-to-device and device-to-host copies.
The trace is small enough for the device tool to bring back (Python tracing off), so a session
without a GPU can read it with ``--summarize``.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import statistics
import sys
import time

import harness


# name -> (step outputs to host through pinned memory, OutOfCore.early_host_copies, jgrind.hostio.rows
# threads (None: the backend's choice), OutOfCore.staging_pieces (None: the engine's default,
# 8 off the CPU backend), OutOfCore.pinned_inputs)
VARIANTS = {"default": (True, True, None, None, False),
            "pageable": (False, True, None, None, False),
            "no-early-copies": (True, False, None, None, False),
            "pageable-no-early-copies": (False, False, None, None, False),
            "pageable-one-row-thread": (False, True, 1, None, False),
            "one-row-thread": (True, True, 1, None, False),
            "pieces-1": (True, True, None, 1, False), "pieces-4": (True, True, None, 4, False),
            "pieces-8": (True, True, None, 8, False),
            "pinned-inputs": (True, True, None, None, True)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_source(p, rmat=(1_000_000, 10_000_000))
    harness.add_features(p)
    harness.add_hidden(p)
    harness.add_policy(p, harness.POLICIES + ("grinnder",), default="host")
    harness.add_parts(p, default=8)
    harness.add_budgets(p)
    harness.add_epochs(p, 2, help="timed epochs before the traced one (per variant; an "
                                  "epoch that compiles programs is not timed)")
    harness.add_store(p)
    p.add_argument("--trace", help="write the traced epoch here (a jax.profiler log folder; "
                                   "with --variants, one folder per variant under it)")
    p.add_argument("--variants", default="default",
                   help="comma-separated engine settings to time one after the other on the "
                        "same engine (its programs compiled once): "
                        f"{', '.join(VARIANTS)}")
    p.add_argument("--compile-effort", default="quick", choices=("quick", "full"),
                   help="how hard XLA works on each partition step (jgrind.engine."
                        "compile_effort): quick skips a GPU's autotuning; full is XLA's default")
    p.add_argument("--gpu-paths", action="store_true",
                   help="on the CPU backend, take the transfer paths the engine takes on a GPU "
                        "(device rows kept there, outputs through pinned_host memory, inputs "
                        "in 8 row ranges, page-locked input buffers for --variants "
                        "pinned-inputs, spare buffers made on the device), to count the "
                        "programs they compile")
    p.add_argument("--summarize", metavar="DIR", help="only summarize a trace written earlier")
    p.add_argument("--top", type=int, default=4, help="event names shown per line")
    p.add_argument("--programs", default="names", choices=("off", "names", "shapes"),
                   help="list the programs each epoch compiles, grouped by function name "
                        "(jgrind.engine.program_log), with each one's argument types (shapes)")
    p.add_argument("--predict", action="store_true",
                   help="after the epochs, one prediction (the evaluation sweeps, dropout "
                        "off): its seconds and the programs it compiles beyond training's")
    args = p.parse_args()
    if args.summarize:
        summarize(args.summarize, args.top)
        return
    run(args)


def run(args) -> None:
    import jax
    import optax

    from jgrind.hostio import rows
    from jgrind.engine import OutOfCore
    from jgrind.engine.compile_effort import by_name
    from jgrind.engine.program_log import ProgramLog

    log = ProgramLog().__enter__()  # open for the process: every program is counted
    log.mark("setup")

    on_cpu = jax.default_backend() == "cpu"
    if args.gpu_paths and on_cpu:
        from jgrind.engine import build, spares
        build.PINNED_STAGING_ON_CPU = True
        spares.DEVICE_PLACEHOLDERS_ON_CPU = True
    t = time.perf_counter()
    graph, model, _ = harness.graph_and_model(rmat=args.rmat, features=args.features,
                                              hidden=args.hidden)
    pg = harness.partition(graph, model, args.parts)
    print(f"graph and {args.parts} partitions: {time.perf_counter() - t:.1f} s; "
          f"devices {jax.devices()}")
    ex = OutOfCore(graph, model, optax.adam(1e-3), policy=harness.policy(args.policy, args.store),
                   partitioned=pg, store=args.store, device_budget=args.device_budget,
                   host_budget=args.host_budget,
                   compile_effort=by_name(args.compile_effort))
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        print(f"error: unknown variant(s) {unknown}; choose from {list(VARIANTS)}",
              file=sys.stderr)
        sys.exit(2)
    try:
        training = harness.Training(ex, model, optax.adam(1e-3))
        epoch = 0

        def one(label: str, trace_dir=None) -> tuple[float, int]:
            """An epoch: its seconds and the programs it compiled."""
            nonlocal epoch
            if trace_dir:
                options = jax.profiler.ProfileOptions()
                options.python_tracer_level = 0  # Python calls would swamp the trace
                jax.profiler.start_trace(trace_dir, profiler_options=options)
            log.mark(f"epoch {epoch}")
            seconds, loss = training.epoch(jax.random.key(epoch))
            if trace_dir:
                jax.profiler.stop_trace()
            compiled = log.phase(f"epoch {epoch}")
            print(f"epoch {epoch} ({label}{', traced' if trace_dir else ''}): {seconds:.3f} s, "
                  f"loss {float(loss):.4f}, {len(compiled)} "
                  f"programs compiled in {log.seconds(compiled):.1f} s")
            if compiled and args.programs != "off":
                print(log.report(compiled, shapes=args.programs == "shapes"))
            epoch += 1
            return seconds, len(compiled)

        setup = log.phase("setup")
        print(f"before the first epoch: {len(setup)} programs compiled in "
              f"{log.seconds(setup):.1f} s")
        if setup and args.programs != "off":
            print(log.report(setup, shapes=args.programs == "shapes"))
        if args.gpu_paths and on_cpu:
            from jgrind.engine.build import GPU_STAGING_PIECES
            from jgrind.hostio import transfers
            ex.keep_device_rows = True
            ex.pinned_host = transfers.pinned_host()
            ex.staging_pieces = GPU_STAGING_PIECES
        # None on the CPU backend without --gpu-paths: "default" is "pageable" there
        pinned_host = ex.pinned_host
        default_pieces = ex.staging_pieces
        first, _ = one("warm-up")
        medians, notes = {}, []
        for name in variants:
            pinned, ex.early_host_copies, threads, pieces, pinned_inputs = VARIANTS[name]
            ex.staging_pieces = default_pieces if pieces is None else pieces
            if pinned_inputs and ex.built.store.input_staging is None:
                print(f"{name}: skipped, no page-locked input buffers on this backend "
                      "(on the CPU backend --gpu-paths makes them)")
                continue
            ex.pinned_inputs = pinned_inputs
            ex.pinned_host = pinned_host if pinned else None
            rows.set_threads(threads)
            times, warmed, compiling = time_variant(lambda: one(name), args.epochs)
            medians[name] = statistics.median(times)
            if warmed:
                notes.append(f"{name}'s first epoch compiled programs: not timed, one more run")
            if compiling:
                notes.append(f"{name}: {compiling} of {len(times)} timed epochs compiled "
                             "programs all the same")
            if args.trace:
                folder = os.path.join(args.trace, name) if len(variants) > 1 else args.trace
                one(name, folder)
                summarize(folder, args.top)
        print("median epoch per variant: " + ", ".join(
            f"{name} {s:.3f} s" for name, s in medians.items())
            + "".join(f"; {note}" for note in notes))
        if medians:
            name, later = next(iter(medians.items()))
            print(f"first epoch {first:.3f} s, {first / later:.2f}x {name}'s median")
        if args.predict:
            predict(ex, training.params, log, args.programs)
    finally:
        ex.close()
    log.__exit__(None, None, None)
    print(f"programs compiled in all: {len(log.programs)} ({log.seconds():.1f} s), "
          f"{len(log.phase('setup'))} of them before the first epoch")


def predict(ex, params, log, programs: str) -> None:
    """One `OutOfCore.predict` (the evaluation's forward sweeps): its seconds and the programs
    it compiled, those training's epochs had not."""
    log.mark("predict")
    start = time.perf_counter()
    ex.predict(params)
    compiled = log.phase("predict")
    print(f"prediction: {time.perf_counter() - start:.3f} s, {len(compiled)} programs compiled "
          f"in {log.seconds(compiled):.1f} s")
    if compiled and programs != "off":
        print(log.report(compiled, shapes=programs == "shapes"))


def time_variant(epoch, count: int) -> tuple[list, bool, int]:
    """``count`` timed epochs of one variant; ``epoch()`` runs one and returns its seconds and
    the programs it compiled. A variant's first epoch that compiles is its warm-up: it is not
    timed, and one more epoch runs in its place (an H200 compiled 10 programs in 0.9 s of
    pieces-8's first epoch, 2.60 s against 1.59 s for the next). Only the first: a variant
    that compiles in every epoch still ends, and its later epochs count.
    Returns the timed seconds, whether an epoch warmed, and how many timed ones compiled."""
    times, warmed, compiling = [], False, 0
    while len(times) < count:
        seconds, programs = epoch()
        if programs and not warmed and not times:
            warmed = True
            continue
        times.append(seconds)
        compiling += bool(programs)
    return times, warmed, compiling


def _union(intervals: list) -> int:
    """Total length of the union of (start, end) intervals."""
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def summarize(directory: str, top: int = 4) -> None:
    """Print each plane's lines with their busy time over the traced window."""
    from jax.profiler import ProfileData

    files = sorted(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True))
    if not files:
        print(f"error: no *.xplane.pb under {directory}; pass the folder given to --trace",
              file=sys.stderr)
        sys.exit(2)
    path = files[-1]
    data = ProfileData.from_file(path)
    print(f"trace {path} ({os.path.getsize(path) / 2**20:.1f} MiB)")
    lines = []  # (plane, line, intervals, per-name ns)
    lo, hi = None, None
    for plane in data.planes:
        for line in plane.lines:
            spans, names = [], collections.Counter()
            for ev in line.events:
                s, d = ev.start_ns, ev.duration_ns
                spans.append((s, s + d))
                names[ev.name] += d
            if not spans:
                continue
            lines.append((plane.name, line.name, spans, names))
            if plane.name.startswith("/device:"):
                first, last = min(s for s, _ in spans), max(e for _, e in spans)
                lo = first if lo is None else min(lo, first)
                hi = last if hi is None else max(hi, last)
    if lo is None:  # no device plane (the CPU backend): the window is the host's
        lo = min(min(s for s, _ in sp) for *_, sp, _ in lines)
        hi = max(max(e for _, e in sp) for *_, sp, _ in lines)
    window = max(hi - lo, 1)
    print(f"window {window / 1e9:.3f} s (first to last device event)")
    for plane, name, spans, names in lines:
        busy = _union([(max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi])
        if busy < window * 1e-3:
            continue
        heavy = ", ".join(f"{n[:48]} {d / 1e9:.3f}" for n, d in names.most_common(top))
        print(f"  {plane} | {name}: busy {busy / 1e9:.3f} s ({busy / window:.0%}), "
              f"{len(spans)} events; {heavy}")


if __name__ == "__main__":
    main()
