"""The planner's predicted epoch on 1, 2, 4 and 8 devices, and the speed-up it predicts.

    python tools/predict_devices.py                              # ogbn-products size
    python tools/predict_devices.py --rmat 200000 2000000 --devices 1 2   # quick

Nothing trains: the benchmarks' R-MAT graph (ogbn-products-sized by default: 2,449,029 nodes,
61,859,140 edges, 100 features, 47 classes) and 3-layer GCN, cut by label propagation into
``--parts`` partitions (at least one per device), placed on K devices by predicted step time
(`jgrind.plan.placement`), the halo exchange listed (`jgrind.plan.exchange`) and the epoch
priced (`jgrind.plan.sharded`) over each link, with:
- this machine's saved profile (`jgrind profile`), whose devices, on a CPU, share its cores;
- a GPU profile: ``--gpu-profile FILE`` (one `jgrind profile` wrote on a GPU; the GPU script
  saves one; with ``--gpu-epoch`` too, its compute rates scaled to that measured epoch), or
  else this machine's profile calibrated to a measured GPU epoch
  (``--gpu-epoch SECONDS`` of the in-memory epoch of the R-MAT graph of 2.4M nodes, 62M
  edges and 100 features with hidden 256; default: the H200's 0.441 s in docs/results.md,
  section 8, target 3), every compute rate scaled alike, with the H200's measured link rates
  (37.75 GB/s to the device and 42.13 GB/s back from `pinned_host`) for the route through
  the host.
GriNNder's paper reports 1.25x, 1.60x and 2.44x on 2, 3 and 4 GPUs (IGB-medium); printed
beside the predicted speed-ups.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import harness

PRODUCTS = (2_449_029, 61_859_140)
GRINNDER_SPEEDUP = {2: 1.25, 3: 1.60, 4: 2.44}
H200_EPOCH = 0.441                        # docs/results.md, section 8, target 3
H200_LINK = (37.75e9, 42.13e9)            # to the device, to the host: section 8's transfers
REFERENCE = (2_400_000, 62_000_000, 100)  # the graph that epoch was measured on


def gpu_profile(args, profile):
    from jgrind.plan.cost import Workload
    from jgrind.plan.profile import load
    from jgrind.plan.sharded import calibrate
    nodes, edges, features = REFERENCE
    reference = Workload.whole(harness.gcn(features, harness.CLASSES, args.hidden), features,
                               nodes, edges)
    if args.gpu_profile:
        measured = load(args.gpu_profile)
        if args.gpu_epoch is None:
            return measured, f"the GPU profile {args.gpu_profile}"
        # The GPU's own link rates stay; only its compute rates move to the measured epoch
        return calibrate(measured, reference, args.gpu_epoch), (
            f"the GPU profile {args.gpu_profile} scaled to a {args.gpu_epoch} s in-memory "
            f"epoch at {nodes:,} nodes, {edges:,} edges, {features} features")
    args.gpu_epoch = H200_EPOCH if args.gpu_epoch is None else args.gpu_epoch
    calibrated = calibrate(profile, reference, args.gpu_epoch)
    calibrated = dataclasses.replace(
        calibrated, link_to_device_bw=H200_LINK[0], link_to_host_bw=H200_LINK[1],
        machine={**profile.machine, "backend": "gpu", "device_kind": "calibrated"})
    return calibrated, (f"this machine's profile scaled to a {args.gpu_epoch} s in-memory "
                        f"epoch at {nodes:,} nodes, {edges:,} edges, {features} features")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_source(p, rmat=PRODUCTS)
    p.add_argument("--features", type=int, default=100)
    p.add_argument("--classes", type=int, default=47)
    harness.add_hidden(p)
    p.add_argument("--parts", type=int, default=8, help="partitions (at least one per device)")
    p.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--gpu-profile", help="a profile `jgrind profile` saved on a GPU")
    p.add_argument("--gpu-epoch", type=float,
                   help="seconds of a measured in-memory GPU epoch to calibrate to (default: "
                        f"{H200_EPOCH} without --gpu-profile; with it, none)")
    harness.add_json(p)
    args = p.parse_args()

    from jgrind.partition import partition_graph
    from jgrind.partition.partitioners import label_propagation
    from jgrind.plan.cost import parameter_count
    from jgrind.plan.exchange import epoch_exchange_bytes, exchange_plan
    from jgrind.plan.placement import Rates, place
    from jgrind.plan.profile import load_or_measure
    from jgrind.plan.sharded import predictions

    print(f"# {harness.command()}\n# {harness.machine()}", flush=True)
    cpu = load_or_measure()
    gpu, gpu_source = gpu_profile(args, cpu)
    graph = harness.rmat_graph(*args.rmat, features=args.features, classes=args.classes)
    model = harness.gcn(args.features, args.classes, args.hidden)
    normalized = model.normalize(graph)
    params = parameter_count(model)
    print(f"# {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, {args.features} features, "
          f"GCN 3 layers, hidden {args.hidden}; GPU: {gpu_source}", flush=True)
    cuts = {}
    results = {"nodes": graph.num_nodes, "edges": graph.num_edges, "gpu_profile": gpu_source,
               "rows": []}
    base = {}
    for k in args.devices:
        parts = max(args.parts, k)
        if parts not in cuts:
            cuts[parts] = partition_graph(
                normalized, label_propagation(normalized, parts, seed=0), num_parts=parts)
        pg = cuts[parts]
        for name, profile in (("CPU-2 profile", cpu), ("GPU", gpu)):
            placement = place(pg, model, graph.num_features, k, Rates.of(profile))
            exchange = exchange_plan(normalized.indptr, normalized.indices,
                                     placement.device_of[pg.assignment], k)
            moved, minimum = epoch_exchange_bytes(exchange, model, graph.num_features)
            for prediction in predictions(exchange, normalized.indptr, model,
                                          graph.num_features, profile, params):
                key = (name, prediction.link.name)
                base.setdefault(key, prediction.epoch_seconds)
                speedup = base[key] / prediction.epoch_seconds
                row = {"devices": k, "parts": parts, "profile": name,
                       "link": prediction.link.name, "epoch_seconds": prediction.epoch_seconds,
                       "compute_seconds": prediction.compute_seconds,
                       "exchange_seconds": prediction.exchange_seconds,
                       "allreduce_seconds": prediction.allreduce_seconds,
                       "speedup": speedup, "exchange_bytes": moved,
                       "exchange_minimum": minimum,
                       "peak_device_gib": float(prediction.device_peak.max()) / 2**30}
                results["rows"].append(row)
                grinnder = GRINNDER_SPEEDUP.get(k)
                print(f"{k} device{'s' if k > 1 else ' '} {name:>13}, {prediction.link.name}: "
                      f"{prediction.epoch_seconds:.3f} s (compute "
                      f"{prediction.compute_seconds:.3f}, exchange "
                      f"{prediction.exchange_seconds:.3f}); speed-up {speedup:.2f}x"
                      + (f" (GriNNder {grinnder:.2f}x)" if grinnder else "")
                      + f"; peak {row['peak_device_gib']:.2f} GiB a device", flush=True)
    harness.write_json(args.json, results)


if __name__ == "__main__":
    sys.exit(main())
