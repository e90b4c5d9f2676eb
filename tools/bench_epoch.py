"""Full-graph epoch time: jgrind vs PyG full-batch, same graph, same model, same run.

    python tools/bench_epoch.py                    # 1M nodes, 10M directed edges, 128 features
    python tools/bench_epoch.py --nodes 200000 --edges 2000000 --epochs 5   # quick
    python tools/bench_epoch.py --nodes 132534 --edges 79122504 --features 8 --tasks 112 \
        --skew 0.45,0.2,0.2                        # ogbn-proteins' size (mean degree 597)

A 3-layer GCN (hidden 256, ReLU, dropout 0.5, Adam) trained on the whole graph, one optimizer step
per epoch. The graph is an R-MAT power-law graph (`jgrind.generators.rmat`), generated once and
saved to a temporary .npz; jgrind and PyG each run in their own subprocess that loads it, so
each reports its own peak resident memory (``ru_maxrss``, graph included).

With ``--tasks T`` the task is multi-label (``rmat(num_tasks=T)``): both sides train binary
cross entropy over T targets (PyG: ``BCEWithLogitsLoss`` on the training rows, as OGB's
ogbn-proteins example). PyG runs ``GCNConv(cached=True)`` on a ``torch.sparse_csr`` adjacency, the sparse-matrix path
of PyG's OGB examples (``adj_t``), with ``torch.set_num_threads`` = the machine's cores. Where
PyTorch sees a CUDA GPU, PyG runs on it (as JAX does on a GPU machine), timed with
``torch.cuda.synchronize`` and reporting ``torch.cuda.max_memory_allocated``.

It also prints the machine's *floor* for jgrind's epoch: the sum of the times of the dense
matmuls and sparse products the epoch performs, each measured alone.
Needs the ``bench`` extra (torch, torch_geometric) for the PyG side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

import harness


# -- jgrind ------------------------------------------------------------------------------------
def run_jgrind(path: str, hidden: int, epochs: int) -> dict:
    import jax
    import optax

    from jgrind.train import InMemory

    graph = harness.load_npz(path)
    model = harness.gcn(graph.num_features, graph.num_classes, hidden)
    optimizer = optax.adam(0.01)
    t0 = time.perf_counter()
    ex = InMemory(graph, model, optimizer)
    prep = time.perf_counter() - t0
    training = harness.Training(ex, model, optimizer)
    times = []
    for epoch in range(epochs + 1):  # epoch 0 compiles
        seconds, loss = training.epoch(jax.random.key(epoch))
        times.append(seconds)
    from jgrind.sparse import default_backend
    return {"framework": "jgrind", "epoch_times": times[1:], "compile_epoch": times[0],
            "prepare_seconds": prep, "loss": float(loss),
            "peak_rss_gib": harness.peak_rss() / 2**30,
            "spmm_backend": default_backend()}


# -- PyG ---------------------------------------------------------------------------------------
def run_pyg(path: str, hidden: int, epochs: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv

    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    # the same accelerator JAX would use: a GPU where PyTorch sees one
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    d = harness.read_npz(path)
    n = d["indptr"].size - 1
    # adj_t[dst, src]: our CSR rows are destinations, which is PyG's adj_t convention
    adj_t = torch.sparse_csr_tensor(torch.from_numpy(d["indptr"].astype(np.int64)),
                                    torch.from_numpy(d["indices"].astype(np.int64)),
                                    torch.ones(d["indices"].size), size=(n, n)).to(device)
    x = torch.from_numpy(d["features"]).to(device)
    multilabel = d["labels"].ndim == 2
    y = torch.from_numpy(d["labels"].astype(np.float32 if multilabel else np.int64)).to(device)
    train = torch.from_numpy(d["train_mask"]).to(device)
    c = int(d["num_classes"])
    criterion = F.binary_cross_entropy_with_logits if multilabel else F.cross_entropy
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList([GCNConv(x.shape[1], hidden, cached=True),
                                              GCNConv(hidden, hidden, cached=True),
                                              GCNConv(hidden, c, cached=True)])

        def forward(self, h, adj):
            for i, conv in enumerate(self.convs):
                h = F.dropout(h, 0.5, self.training)
                h = conv(h, adj)
                if i < len(self.convs) - 1:
                    h = h.relu()
            return h

    model = GCN().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    times = []
    for _ in range(epochs + 1):  # epoch 0 builds the cached normalised adjacency
        sync()
        t = time.perf_counter()
        opt.zero_grad()
        loss = criterion(model(x, adj_t)[train], y[train])
        loss.backward()
        opt.step()
        sync()
        times.append(time.perf_counter() - t)
    cuda = device.type == "cuda"
    return {"framework": "pyg", "epoch_times": times[1:], "first_epoch": times[0],
            "loss": float(loss), "peak_rss_gib": harness.peak_rss() / 2**30,
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "peak_device_bytes": torch.cuda.max_memory_allocated() if cuda else None}


# -- floor -------------------------------------------------------------------------------------
def run_floor(path: str, hidden: int, repeats: int) -> dict:
    """Time each dense matmul and sparse product of jgrind's GCN epoch alone (median)."""
    import jax
    import jax.numpy as jnp

    from jgrind import transforms
    from jgrind.sparse import adjacency, spmm

    g = harness.load_npz(path)
    n = g.num_nodes
    norm = transforms.gcn_norm(g)
    adj = jax.device_put(adjacency(norm.indptr, norm.indices, norm.edge_weight, n))
    f, c = g.num_features, g.num_classes
    rng = np.random.default_rng(0)
    mat = lambda r, k: jnp.asarray(rng.standard_normal((r, k), dtype=np.float32))  # noqa
    prod = jax.jit(lambda a, b: a @ b)
    prod_t = jax.jit(lambda a, b: a.T @ b)
    sp = jax.jit(lambda a, x: spmm(a, x))

    def timed(fn, *args):
        jax.block_until_ready(fn(*args))
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            jax.block_until_ready(fn(*args))
            ts.append(time.perf_counter() - t)
        return float(np.median(ts))

    h = hidden
    # jgrind's schedule: layer 1 aggregates at width f (f <= h) then multiplies; layer 2 at h;
    # layer 3 multiplies first (h > c) then aggregates at c. Backward: A^T products at c and h
    # (the features need no gradient, so layer 1 needs no sparse product in backward).
    ops = {
        f"spmm N x {f}": (1, sp, adj, mat(n, f)),
        f"spmm N x {h}": (2, sp, adj, mat(n, h)),
        f"spmm N x {c}": (2, sp, adj, mat(n, c)),
        f"matmul N x {f} @ {f} x {h}": (1, prod, mat(n, f), mat(f, h)),
        f"matmul N x {h} @ {h} x {h}": (2, prod, mat(n, h), mat(h, h)),
        f"matmul N x {h} @ {h} x {c}": (1, prod, mat(n, h), mat(h, c)),
        f"matmul N x {c} @ {c} x {h}": (1, prod, mat(n, c), mat(c, h)),
        f"weight grad ({f} x N) @ N x {h}": (1, prod_t, mat(n, f), mat(n, h)),
        f"weight grad ({h} x N) @ N x {h}": (1, prod_t, mat(n, h), mat(n, h)),
        f"weight grad ({h} x N) @ N x {c}": (1, prod_t, mat(n, h), mat(n, c)),
    }
    table = {}
    for name, (count, fn, *args) in ops.items():
        table[name] = {"count": count, "seconds": timed(fn, *args)}
    floor = sum(v["count"] * v["seconds"] for v in table.values())
    return {"framework": "floor", "ops": table, "floor_seconds": floor}


# -- driver ------------------------------------------------------------------------------------
def child(kind: str, path: str, args) -> dict:
    return harness.run_child([sys.executable, __file__, "--child", kind, "--graph", path,
                              "--hidden", str(args.hidden), "--epochs", str(args.epochs)], kind)


def main():
    from jgrind.hostio.allocator import relaunch_if_wanted
    relaunch_if_wanted()  # JGRIND_HUGE_PAGES=1: with glibc huge pages, as the jgrind command
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_graph_size(p, nodes=1_000_000, edges=10_000_000)
    harness.add_hidden(p)
    harness.add_epochs(p, 10)
    p.add_argument("--skip-pyg", action="store_true")
    harness.add_json(p)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--graph", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        fn = {"jgrind": run_jgrind, "pyg": run_pyg, "floor": run_floor}[args.child]
        print(json.dumps(fn(args.graph, args.hidden, args.epochs)))
        return

    t0 = time.perf_counter()
    g = harness.rmat_graph(args.nodes, args.edges, args.features, args.classes, args.tasks,
                           args.skew)
    gen = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "graph.npz")
        harness.save_npz(g, path)
        del g
        results = {"graph": {"nodes": args.nodes, "edges": args.edges,
                             "features": args.features, "classes": args.classes,
                             "tasks": args.tasks, "skew": args.skew,
                             "generate_seconds": gen},
                   "jgrind": child("jgrind", path, args),
                   "floor": child("floor", path, args)}
        if not args.skip_pyg:
            results["pyg"] = child("pyg", path, args)
    report(results, args)
    harness.write_json(args.json, results)


def report(r: dict, args) -> None:
    med = lambda xs: float(np.median(xs))  # noqa: E731
    g = r["graph"]
    task = (f"{g['tasks']} binary targets (BCE)" if g.get("tasks")
            else f"{g['classes']} classes")
    print(f"graph: R-MAT, {g['nodes']:,} nodes, {g['edges']:,} directed edges, "
          f"{g['features']} features, {task}; model: 3-layer GCN, hidden "
          f"{args.hidden}; median of {args.epochs} epochs after one warm-up")
    print(f"machine: {harness.machine()} (jgrind and PyG alike)")
    j = r["jgrind"]
    print(f"  jgrind ({j['spmm_backend']} spmm): median epoch {med(j['epoch_times']):.3f} s, "
          f"peak RSS {j['peak_rss_gib']:.2f} GiB")
    if "pyg" in r:
        q = r["pyg"]
        print(f"  PyG {q['torch']} ({q['threads']} threads): median epoch "
              f"{med(q['epoch_times']):.3f} s, peak RSS {q['peak_rss_gib']:.2f} GiB")
        print(f"  ratio jgrind / PyG: {med(j['epoch_times']) / med(q['epoch_times']):.2f}")
    fl = r["floor"]
    print(f"  floor (jgrind's matmuls and sparse products, each alone): "
          f"{fl['floor_seconds']:.3f} s = {fl['floor_seconds'] / med(j['epoch_times']):.0%} "
          "of jgrind's epoch")
    for name, v in fl["ops"].items():
        print(f"    {v['count']} x {name:<34} {v['seconds'] * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
