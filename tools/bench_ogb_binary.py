"""Loading OGB's binary layout (ogbn-papers100M's ``raw/data.npz``): time and memory of reading
every array whole, as OGB's loader does, against jgrind's slice-at-a-time reader, each in a
fresh process and optionally in a memory cgroup (as on a machine with that much RAM).

    python tools/bench_ogb_binary.py --nodes 4000000 --edges 40000000 --features 128 \\
        --folder /tmp/ogb-bin [--stored] [--undirected] [--memory-limit 3GiB] [--runs ...]

The dataset is written once into ``--folder`` (kept for later runs) with OGB's file names and a
papers100M-like task: 172 classes, 1.4 % of the nodes labelled and split 78/8/14. Its arrays are
compressed (``np.savez_compressed``, as OGB ships ogbn-papers100M) unless ``--stored``.

Runs:
  whole    ``np.load`` every array of both archives (OGB's ``read_binary_graph_raw``), then
           `jgrind.graph.from_edges`: reading the arrays whole, then sorting the edges at once
  jgrind   ``jgrind.datasets.load("ogb:...")``: the CSR in two passes over slices of the edges,
           features decompressed slice by slice into memory (mapped in place with ``--stored``)
  scratch  the same with ``scratch=`` a folder: features decompressed into a mapped file there
  convert  ``jgrind convert --dataset ogb:... --out ...`` (it uses a scratch folder on its own)

``--undirected`` adds the reverse of every edge (``to_undirected=True``; for ``whole``,
`jgrind.transforms.make_undirected` after `from_edges`), as GCN examples on ogbn-papers100M do.

Each prints its time, its peak RSS (``VmHWM``: file pages it mapped and touched count too),
its anonymous memory at the end (``RssAnon``), and a CRC of the graph's fingerprint
(`jgrind.Graph.fingerprint`): the same graph gives the same number in every run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402
from memory_cgroup import drop_caches, joining, memory_cgroup  # noqa: E402

RUNS = ("whole", "jgrind", "scratch", "convert")


def write_dataset(folder: pathlib.Path, nodes: int, edges: int, features: int,
                  stored: bool) -> pathlib.Path:
    d = folder / "ogbn_papers100M"
    if (d / "raw/node-label.npz").exists():
        return d
    rng = np.random.default_rng(0)
    (d / "raw").mkdir(parents=True, exist_ok=True)
    save = np.savez if stored else np.savez_compressed
    labelled = np.sort(rng.choice(nodes, max(3, int(0.014 * nodes)), replace=False))
    label = np.full((nodes, 1), np.nan, np.float32)
    label[labelled, 0] = rng.integers(0, 172, labelled.size)
    save(d / "raw/data.npz", edge_index=rng.integers(0, nodes, (2, edges)),
         node_feat=rng.standard_normal((nodes, features), np.float32),
         num_nodes_list=np.array([nodes]), num_edges_list=np.array([edges]))
    save(d / "raw/node-label.npz", node_label=label)
    ids = rng.permutation(labelled)
    cut = np.cumsum([int(0.78 * ids.size), int(0.08 * ids.size)])
    (d / "split/time").mkdir(parents=True, exist_ok=True)
    for part, chunk in zip(("train", "valid", "test"), np.split(ids, cut)):
        with gzip.open(d / "split/time" / f"{part}.csv.gz", "wt") as f:
            f.write("".join(f"{i}\n" for i in chunk))
    return d


def run(kind: str, dataset: pathlib.Path, undirected: bool) -> dict:
    """In this fresh process: one way of loading ``dataset``."""
    import jgrind
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=dataset.parent) as tmp:
        if kind == "whole":
            from jgrind.datasets.ogb import _masks, _targets
            from jgrind.graph import class_count
            with np.load(dataset / "raw/data.npz") as archive:
                data = dict(archive)
            with np.load(dataset / "raw/node-label.npz") as archive:
                label = archive["node_label"]
            labels = _targets(label.astype(np.float64), dataset)
            masks = _masks(dataset / "split/time", len(labels))
            graph = jgrind.from_edges(*data["edge_index"], data["node_feat"], labels,
                                      num_classes=class_count(labels, name=dataset.name),
                                      train_mask=masks[0], val_mask=masks[1],
                                      test_mask=masks[2], name=dataset.name)
            if undirected:
                graph = jgrind.transforms.make_undirected(graph)
        elif kind in ("jgrind", "scratch"):
            graph = jgrind.datasets.load(f"ogb:{dataset}", to_undirected=undirected,
                                         **({"scratch": tmp} if kind == "scratch" else {}))
        elif kind == "convert":
            from jgrind.cli import main
            out = pathlib.Path(tmp) / "saved"
            if main(["convert", "--dataset", f"ogb:{dataset}", "--out", str(out), "--set",
                     f"dataset_options=to_undirected:{str(undirected).lower()}"]) != 0:
                raise SystemExit("convert failed")
            graph = jgrind.datasets.load(f"npy:{out}")
        else:
            raise SystemExit(f"unknown run {kind!r}; choose from {', '.join(RUNS)}")
        seconds = time.perf_counter() - t0
        anon, peak = harness.resident("RssAnon"), harness.resident("VmHWM")
        # one number for the whole graph: equal in every run that built the same graph
        fingerprint = zlib.crc32(json.dumps(graph.fingerprint(), sort_keys=True).encode())
    return {"seconds": seconds, "anon": anon, "peak": peak, "fingerprint": fingerprint}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4_000_000)
    p.add_argument("--edges", type=int, default=40_000_000)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--folder", required=True)
    p.add_argument("--stored", action="store_true", help="np.savez (uncompressed) archives")
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--undirected", action="store_true",
                   help="make the graph undirected (to_undirected=True; whole: make_undirected)")
    p.add_argument("--memory-limit", default="", help="run each in a memory cgroup this size")
    p.add_argument("--_run", help=argparse.SUPPRESS)
    args = p.parse_args()
    folder = pathlib.Path(args.folder)
    if args._run:
        print("RESULT " + json.dumps(run(args._run, folder / "ogbn_papers100M",
                                         args.undirected)))
        return
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from jgrind.config import parse_bytes
    limit = parse_bytes(args.memory_limit)
    t0 = time.perf_counter()
    dataset = write_dataset(folder, args.nodes, args.edges, args.features, args.stored)
    sizes = {f.name: f.stat().st_size for f in (dataset / "raw").iterdir()}
    print(f"dataset {dataset} ({', '.join(f'{k} {v / 2**30:.2f} GiB' for k, v in sizes.items())}"
          f"; ready in {time.perf_counter() - t0:.0f} s); "
          f"{'undirected' if args.undirected else 'directed'}; memory limit: "
          f"{args.memory_limit or 'none'}", flush=True)
    for kind in args.runs.split(","):
        drop_caches()  # every run reads the archives from the disk
        cmd = [sys.executable, __file__, "--folder", str(folder), "--_run", kind,
               *(["--undirected"] if args.undirected else [])]
        t1 = time.perf_counter()
        with memory_cgroup(limit) as procs:
            done = subprocess.run(joining(procs, cmd), capture_output=True, text=True)
        lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        if done.returncode or not lines:
            why = "killed (out of memory?)" if done.returncode in (-9, 137) else \
                f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
            print(f"{kind:8s} {why} after {time.perf_counter() - t1:.0f} s", flush=True)
            continue
        r = json.loads(lines[0][len("RESULT "):])
        print(f"{kind:8s} {r['seconds']:8.1f} s  peak RSS {r['peak'] / 2**30:6.2f} GiB  "
              f"anonymous at the end {r['anon'] / 2**30:6.2f} GiB  fingerprint "
              f"{r['fingerprint']}", flush=True)


if __name__ == "__main__":
    main()
