"""Several processes that each read only their own rows of a saved graph (`Sharded.from_saved`,
`jgrind.devices.local`) against the in-memory computation.

The row-wise normalisations are checked against the whole graph's here; the processes run as
subprocesses joined by `jax.distributed` (gloo), as in `test_devices`: two of two devices each
(the library), and two of one device each (``jgrind launch -- train``). Tolerances are
`test_devices`'.
"""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from test_devices import (FAST_COMPILE, _environment, _gradient_error,
                          _run_processes)

HERE = pathlib.Path(__file__).resolve().parent


def _saved_graph(folder):
    from helpers import csbm_graph
    from jgrind.datasets import save_graph
    return save_graph(csbm_graph(), folder, overwrite=True)


# -- the row-wise normalisations -----------------------------------------------------------
def _messy_graph(weighted: bool):
    """A graph with self loops, duplicate edges and rows not sorted by source."""
    from helpers import csbm_graph
    from jgrind.graph import Graph
    g = csbm_graph()
    rng = np.random.default_rng(0)
    n = g.num_nodes
    src = np.concatenate([g.indices, np.arange(0, n, 7), g.indices[:50]])
    dst = np.concatenate([g.edge_destinations(), np.arange(0, n, 7),
                          g.edge_destinations()[:50]])
    order = np.lexsort((rng.random(src.size), dst))
    weight = rng.random(src.size).astype(np.float32)[order] if weighted else None
    return Graph(indptr=np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]),
                 indices=src[order], features=g.features, labels=g.labels,
                 train_mask=g.train_mask, val_mask=g.val_mask, test_mask=g.test_mask,
                 num_classes=g.num_classes, edge_weight=weight)


def _rows_of(indptr, indices, weight, rows):
    indptr = np.asarray(indptr, np.int64)
    degree = indptr[rows + 1] - indptr[rows]
    local = np.concatenate([[0], np.cumsum(degree)])
    edge = np.repeat(indptr[rows] - local[:-1], degree) + np.arange(local[-1])
    return local, np.asarray(indices)[edge], None if weight is None else weight[edge]


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_row_normalisations_equal_the_whole_graphs_on_those_rows(weighted):
    from jgrind import transforms as T
    graph = _messy_graph(weighted)
    n = graph.num_nodes
    rows = np.sort(np.random.default_rng(1).choice(n, n // 3, replace=False))
    indptr, indices, weight = _rows_of(graph.indptr, graph.indices, graph.edge_weight, rows)

    def expect(whole):
        return _rows_of(whole.indptr, whole.indices, whole.edge_weight, rows)

    # gcn: the degrees of every node's looped row, as its owner would count and share them
    every = T.rows_with_self_loops(np.arange(n), graph.indptr, graph.indices,
                                   graph.edge_weight, num_nodes=n)
    degree = T.row_degrees(every[0], every[2])
    looped = T.rows_with_self_loops(rows, indptr, indices, weight, num_nodes=n)
    got = (looped[0], looped[1], T.gcn_norm_rows(rows, *looped, degree))
    for a, b in zip(got, expect(T.gcn_norm(graph))):
        np.testing.assert_array_equal(a, b)
    # sage: mean over in-neighbours without self loops
    plain = T.rows_without_self_loops(rows, indptr, indices, weight, num_nodes=n)
    got = (plain[0], plain[1], T.mean_norm_rows(plain[0], plain[2]))
    for a, b in zip(got, expect(T.mean_norm(T.remove_self_loops(graph)))):
        np.testing.assert_array_equal(a, b)
    # gat: self loops, no weights
    got = T.rows_with_self_loops(rows, indptr, indices, None, num_nodes=n)
    whole = expect(T.add_self_loops(graph.replace(edge_weight=None)))
    np.testing.assert_array_equal(got[0], whole[0])
    np.testing.assert_array_equal(got[1], whole[1])
    assert got[2] is None and whole[2] is None


# -- two processes of two devices: the library ------------------------------------------------
def _run_process(coordinator: str, process_id: int, folder: str, assignment: str) -> dict:
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=2,
                               process_id=process_id, initialization_timeout=60)
    import optax

    from helpers import reference
    from jgrind import models
    from jgrind.datasets import load
    from jgrind.datasets.saved_arrays import saved_assignment
    from jgrind.devices import Sharded
    from jgrind.plan.exchange import exchange_plan

    model = models.sage(8, 16, 4, num_layers=2, dropout=0.5, residual=True, layer_norm=True)
    ex = Sharded.from_saved(folder, model, optax.sgd(0.1), devices=4,
                            partitioner=saved_assignment(assignment))
    read = dict(ex.graph.saved.read)
    mine = [d for d, dev in enumerate(ex.devices) if dev.process_index == jax.process_index()]
    my_rows = np.sort(np.concatenate([ex.exchange.rows[d] for d in mine]))
    params = model.init(jax.random.key(0))
    key = jax.random.key(42)
    loss, grads = ex.loss_and_grad(params, key)
    # the whole graph, loaded only now, for the comparisons
    graph = load(f"npy:{folder}")
    normalized = model.normalize(graph)
    whole = exchange_plan(normalized.indptr, normalized.indices, ex.exchange.device_of, 4)
    same_plan = (np.array_equal(whole.counts, ex.exchange.counts)
                 and all(np.array_equal(a, b) for a, b in zip(whole.rows, ex.exchange.rows))
                 and all(np.array_equal(whole.sends[o][r], ex.exchange.sends[o][r])
                         for o in range(4) for r in range(4)))
    result = {"process": jax.process_index(), "loss": float(loss), "same_plan": same_plan, "nodes": graph.num_nodes, "own_rows": int(my_rows.size),
              "own_edges": int(np.diff(graph.indptr)[my_rows].sum()),
              "idle_devices": sum(not ex.placement.partitions_of(d) for d in range(4)),
              "read": read}
    if jax.process_index() == 0:  # the other's results are the same replicated values
        ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
        result.update(reference=float(ref_loss), gradient_error=_gradient_error(
            jax.tree.map(np.asarray, grads), ref_grads))
    jax.distributed.shutdown()
    return result


def test_two_processes_of_two_devices_read_their_own_rows_and_compute_the_same(tmp_path):
    """3 saved partitions on 2 x 2 devices (one gets none), SAGE with residuals, LayerNorm and
    dropout: the loss and gradients of the in-memory run; each process's exchange plan is the
    whole graph's; each read the features and in-edges of its own rows only."""
    from jgrind.cli import main
    folder = _saved_graph(tmp_path / "graph")
    assignment = tmp_path / "parts.npy"
    assert main(["partition", "--dataset", f"npy:{folder}", "--parts", "3",
                 "--out", str(assignment)]) == 0
    results = _run_processes(
        lambda coordinator, i: [sys.executable, __file__, coordinator, str(i), str(folder),
                                str(assignment)], _environment(2))
    assert [r["process"] for r in results] == [0, 1]
    assert results[0]["loss"] == results[1]["loss"]
    assert sum(r["idle_devices"] for r in results) >= 1
    assert sum(r["own_rows"] for r in results) == results[0]["nodes"]
    assert results[0]["loss"] == pytest.approx(results[0]["reference"], rel=1e-5)
    assert results[0]["gradient_error"] <= 1.0
    for r in results:
        assert r["same_plan"]
        assert 0 < r["own_rows"] < r["nodes"]
        assert r["read"]["features"] == r["own_rows"]
        assert r["read"]["indices"] == r["own_edges"]


# -- two processes of one device: jgrind launch -- train --------------------------------------
def test_two_processes_train_a_saved_graph_through_the_command_line(tmp_path):
    """`jgrind launch -n 2 -- train --dataset npy:FOLDER --partitioner contiguous` takes the
    process-local path (said in its log), trains as one process does on the whole graph (the
    same losses), and its saved parameters predict, in one process, what the run scored."""
    import jax

    from jgrind.config import RunConfig, build_model, build_optimizer
    from jgrind.datasets import load
    from jgrind.experiment import predict_run
    from jgrind.train import train
    folder = _saved_graph(tmp_path / "graph")
    env = _environment(1)
    env["XLA_FLAGS"] = FAST_COMPILE  # the launcher gives each process its own devices
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "jgrind.cli", "launch", "-n", "2", "--",
                           "train", "--dataset", f"npy:{folder}", "--partitioner", "contiguous",
                           "--epochs", "3", "--set", "hidden=16", "--out", str(run),
                           "--no-progress"], env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    for i in range(2):
        assert f"[{i}] jgrind: process {i} reads only its own rows of {folder}" in done.stdout
    losses = [json.loads(line)["loss"]
              for line in (run / "metrics-seed0.jsonl").read_text().splitlines()]
    graph = load(f"npy:{folder}")
    cfg = RunConfig(hidden=16)
    alone = train(jax.random.key(0), graph, build_model(cfg, graph), build_optimizer(cfg),
                  epochs=3, progress=False)
    assert len(losses) == 3
    np.testing.assert_allclose(losses, [r["loss"] for r in alone.history], rtol=1e-5)
    summary = json.loads((run / "summary.json").read_text())
    _, info = predict_run(run)
    assert info["test"] == pytest.approx(summary["test"][0])


def test_a_saved_assignment_sets_the_partition_count_on_one_device_too(tmp_path):
    """`make_executor` with a saved assignment and no ``num_parts``: the out-of-core engine on
    one device takes the file's partitions and their count (it took its default of 4 and
    refused the file's 3)."""
    import optax

    from helpers import csbm_graph
    from jgrind import models
    from jgrind.datasets.saved_arrays import saved_assignment
    from jgrind.plan import policies
    from jgrind.train import make_executor
    graph = csbm_graph()
    path = tmp_path / "parts.npy"
    np.save(path, (np.arange(graph.num_nodes) % 3).astype(np.int32))
    model = models.gcn(graph.num_features, 16, graph.num_classes, num_layers=2)
    with make_executor(graph, model, optax.sgd(0.1), policy=policies.host_offload(),
                       partitioner=saved_assignment(path)) as ex:
        assert ex.pg.num_parts == 3
        np.testing.assert_array_equal(ex.pg.assignment, np.arange(graph.num_nodes) % 3)


def test_a_saved_assignment_partitions_the_whole_graph_path_too(tmp_path):
    """`--partitioner FILE.npy` outside the process-local path: `Sharded` takes the file's
    partitions (and their count); a count that differs is refused in one line."""
    import jax
    import optax

    from helpers import csbm_graph, reference
    from jgrind import models
    from jgrind.config import RunConfig, build_partitioner
    from jgrind.datasets import DatasetError
    from jgrind.devices import Sharded
    graph = csbm_graph()
    path = tmp_path / "parts.npy"
    np.save(path, (np.arange(graph.num_nodes) % 3).astype(np.int32))
    partitioner = build_partitioner(RunConfig(partitioner=str(path)))
    model = models.gcn(graph.num_features, 16, graph.num_classes, num_layers=2)
    ex = Sharded(graph, model, optax.sgd(0.1), devices=1, partitioner=partitioner)
    assert ex.partitioned.num_parts == 3 and not ex.process_local
    np.testing.assert_array_equal(ex.partitioned.assignment, np.arange(graph.num_nodes) % 3)
    params = model.init(jax.random.key(0))
    loss, _ = ex.loss_and_grad(params, jax.random.key(1))
    ref_loss, _ = reference(graph, model).loss_and_grad(params, jax.random.key(1))
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    with pytest.raises(DatasetError, match=r"has 3 partitions, not 4: set --parts 3"):
        partitioner(graph, 4)
    with pytest.raises(DatasetError, match=r"has 400 nodes but the graph has 60"):
        from helpers import community_graph
        partitioner(community_graph(num_nodes=60), 3)


def test_a_partitioner_that_reads_edges_is_refused(tmp_path):
    import optax

    from jgrind import models
    from jgrind.devices import Sharded
    from jgrind.partition.partitioners import label_propagation
    folder = _saved_graph(tmp_path / "graph")
    model = models.gcn(8, 16, 4)
    with pytest.raises(ValueError, match=r"use contiguous, or a saved assignment"):
        Sharded.from_saved(folder, model, optax.sgd(0.1), devices=1,
                           partitioner=label_propagation)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    print(json.dumps(_run_process(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])))
