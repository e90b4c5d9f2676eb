"""The out-of-core engine over two processes on a saved graph (`jgrind.devices.ShardedOutOfCore`
given a `jgrind.datasets.saved_arrays.SavedGraph`): each process reads, of the features, only
its own partitions' rows and the halo rows they read, pads only its own partitions, and the
training equals in-memory training on the whole graph.

Two local processes of one CPU device each, joined by `jax.distributed` (gloo). Every feature
row a process reads from the saved file is recorded (`SavedArrays.node_rows`, wrapped in the
subprocess) and compared with the rows its partitions need, counted here from the whole
graph's normalised edges. The graph is a ring of near neighbours with a few long edges, so
that those rows are few: a process that read the whole graph would read every row. Processes
given different saved graphs are refused before anything is built. Tolerances are
tests/test_devices.py's.
"""

import pathlib
import re
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from test_devices import (_environment, _gradient_error, _models,  # noqa: E402
                          _run_processes)

NUM_NODES, PARTS, EPOCHS, FEATURES, CLASSES = 1000, 4, 3, 8, 3
CASES = (("gcn", "ssd"),)


def _graph():
    """A ring: node v's in-neighbours are v +- 1..3, and 20 long edges; labels by position."""
    from jgrind.graph import from_edges
    rng = np.random.default_rng(0)
    v = np.arange(NUM_NODES)
    near = [(v, (v + d) % NUM_NODES) for d in (-3, -2, -1, 1, 2, 3)]
    far = rng.integers(0, NUM_NODES, (2, 20))
    src = np.concatenate([s for s, _ in near] + [far[0]])
    dst = np.concatenate([d for _, d in near] + [far[1]])
    y = (v * CLASSES // NUM_NODES).astype(np.int64)
    x = (np.eye(CLASSES)[y] @ rng.standard_normal((CLASSES, FEATURES))
         + rng.standard_normal((NUM_NODES, FEATURES))).astype(np.float32)
    split = rng.permutation(NUM_NODES)
    masks = [np.isin(v, split[a:b]) for a, b in ((0, 300), (300, 500), (500, NUM_NODES))]
    return from_edges(src, dst, x, y, num_classes=CLASSES, train_mask=masks[0],
                      val_mask=masks[1], test_mask=masks[2], name="ring")


def _policy(fate: str, folder: pathlib.Path) -> dict:
    from jgrind.devices.out_of_core import through_host_policy
    from jgrind.plan import policies
    if fate == "host":
        return {"policy": through_host_policy()}
    folder.mkdir(parents=True, exist_ok=True)
    return {"policy": policies.ssd_offload(str(folder)), "store": str(folder)}


def _run_process(coordinator: str, process_id: int, folder: str, scratch: str) -> dict:
    """One of two processes of one CPU device: every case of `CASES`, as JSON-able results."""
    from jgrind.devices import processes
    processes.start(coordinator, 2, process_id, timeout_s=60, heartbeat_timeout_s=30)
    import jax
    import optax

    from jgrind.datasets import load
    from jgrind.datasets.saved_arrays import SavedArrays, SavedGraph
    from jgrind.devices import ShardedOutOfCore
    from jgrind.partition.partitioners import contiguous
    from jgrind.train import InMemory

    read: list = []  # every feature row read from the saved file, in order
    original = SavedArrays.node_rows

    def recorded(self, key, rows):
        if key == "features":
            read.extend(np.asarray(rows).tolist())
        return original(self, key, rows)
    SavedArrays.node_rows = recorded

    built = _models(FEATURES, CLASSES)
    out = {"process": jax.process_index(), "cases": []}
    checks = jax.process_index() == 0  # the in-memory side runs in process 0 only
    for name, fate in CASES:
        model = built[name]
        graph = SavedGraph.open(folder)
        del read[:]
        opt = optax.adam(0.01)
        params = model.init(jax.random.key(0))
        with ShardedOutOfCore(graph, model, opt, devices=2, num_parts=PARTS,
                              partitioner=contiguous, max_shapes=1,
                              **_policy(fate, pathlib.Path(scratch) / f"{process_id}{fate}")
                              ) as ex:
            case = {"model": name, "fate": fate, "read": list(read),
                    "counted": int(graph.saved.read.get("features", 0)),
                    "padded": sorted(int(p.index) for p in ex.engine.built.parts),
                    "process_of_part": [int(ex.devices[int(d)].process_index)
                                        for d in ex.placement.device_of],
                    "assignment": np.asarray(ex.engine.built.pg.assignment).tolist(),
                    "losses": []}
            ours, state = jax.tree.map(jax.numpy.array, params), opt.init(params)
            for epoch in range(EPOCHS):
                key = jax.random.fold_in(jax.random.key(3), epoch)
                if epoch == 0:
                    _, grads = ex.loss_and_grad(ours, key)
                ours, state, loss = ex.step(ours, state, key)
                case["losses"].append(float(loss))
            case["read_after_training"] = len(read) - len(case["read"])
            case["params"] = [np.asarray(a).tolist() for a in jax.tree.leaves(ours)]
        if checks:  # the whole graph, loaded only now
            memory = InMemory(load(f"npy:{folder}"), model, opt)
            ref, ref_state = jax.tree.map(jax.numpy.array, params), opt.init(params)
            case["gradient_error"] = _gradient_error(
                grads, memory.loss_and_grad(ref, jax.random.fold_in(jax.random.key(3), 0))[1])
            case["reference"] = []
            for epoch in range(EPOCHS):
                key = jax.random.fold_in(jax.random.key(3), epoch)
                ref, ref_state, loss = memory.step(ref, ref_state, key)
                case["reference"].append(float(loss))
            case["params_close"] = all(
                np.allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)
                for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref)))
        out["cases"].append(case)
    return out


def _refusal(coordinator: str, process_id: int, folder: str) -> dict:
    """One of two processes given different saved graphs: the refusal it met, if any."""
    from jgrind.devices import processes
    processes.start(coordinator, 2, process_id, timeout_s=60, heartbeat_timeout_s=30)
    import optax

    from jgrind.datasets.saved_arrays import SavedGraph
    from jgrind.devices import ShardedOutOfCore
    from jgrind.partition.partitioners import contiguous
    try:
        ShardedOutOfCore(SavedGraph.open(folder), _models(FEATURES, CLASSES)["gcn"],
                         optax.sgd(0.1), devices=2, num_parts=PARTS, partitioner=contiguous,
                         **_policy("host", pathlib.Path(folder))).close()
    except processes.ProcessError as err:
        return {"refused": str(err)}
    return {"refused": None}


def _start_two(argv_of) -> list:
    """The JSON each of two processes, ``argv_of(coordinator, i)``, printed last."""
    return _run_processes(lambda coordinator, me: [sys.executable, __file__,
                                                   *argv_of(coordinator, me)],
                          _environment(1), timeout=600)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """The saved graph's folder and both processes' JSON, in process order."""
    from jgrind.datasets import save_graph
    root = tmp_path_factory.mktemp("reads")
    folder = save_graph(_graph(), root / "ring")
    return folder, _start_two(lambda coordinator, me: [
        "process", coordinator, str(me), str(folder), str(root)])


def _needed_rows(name: str, assignment: np.ndarray, process_of_part: np.ndarray,
                 process: int) -> set:
    """The nodes whose features ``process``'s partitions read: their own, and the sources of
    their in-edges in the normalised graph (the halo), counted from the whole graph."""
    graph = _models(FEATURES, CLASSES)[name].normalize(_graph())
    mine = process_of_part[assignment] == process
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    return set(np.flatnonzero(mine).tolist()) | set(
        np.asarray(graph.indices)[mine[dst]].tolist())


@pytest.mark.parametrize("name, fate", CASES)
def test_two_processes_on_a_saved_graph_train_as_in_memory(two_processes, name, fate):
    _, results = two_processes
    first, second = [next(c for c in r["cases"] if c["model"] == name) for r in results]
    assert first["losses"] == pytest.approx(first["reference"], rel=1e-5)
    assert first["gradient_error"] <= 1.0
    assert first["params_close"]
    # the other process took the same steps
    assert second["losses"] == first["losses"] and second["params"] == first["params"]


@pytest.mark.parametrize("name, fate", CASES)
def test_each_process_reads_only_the_feature_rows_its_partitions_need(two_processes, name,
                                                                      fate):
    from jgrind.partition.partitioners import contiguous
    _, results = two_processes
    cases = [next(c for c in r["cases"] if c["model"] == name) for r in results]
    normalized = _models(FEATURES, CLASSES)[name].normalize(_graph())
    assignment = contiguous(normalized, PARTS)
    process_of_part = np.array(cases[0]["process_of_part"])
    assert sorted(set(process_of_part.tolist())) == [0, 1]
    for process, case in enumerate(cases):
        assert case["assignment"] == assignment.tolist()
        needed = _needed_rows(name, assignment, process_of_part, process)
        assert len(needed) < 0.7 * NUM_NODES  # (the ring keeps the halo small)
        # every row it needs, each read once, and no other (rows counted however they were
        # read, the whole file included); nothing of the file later
        assert sorted(case["read"]) == sorted(needed)
        assert case["counted"] == len(needed)
        assert case["read_after_training"] == 0
        # only its own partitions padded
        own = np.flatnonzero(process_of_part == process).tolist()
        assert case["padded"] == own and 0 < len(own) < PARTS


def test_processes_given_different_saved_graphs_are_refused(tmp_path):
    """The same graph saved under two names (two descriptions): every process refuses, in
    one line, before anything is built."""
    from jgrind.datasets import save_graph
    graph = _graph()
    folders = [save_graph(graph, tmp_path / "ring"),
               save_graph(graph.replace(name="another"), tmp_path / "another")]
    results = _start_two(lambda coordinator, me: ["refusal", coordinator, str(me),
                                                  str(folders[me])])
    for r in results:
        assert re.fullmatch(r"process 1 \(\w+\) holds other saved graph or partition "
                            r"assignment than process 0 \(\w+\): start every process with "
                            r"the same dataset, settings and flags", r["refused"] or ""), r


if __name__ == "__main__":
    if sys.argv[1] == "refusal":
        print(__import__("json").dumps(_refusal(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
    else:
        print(__import__("json").dumps(_run_process(sys.argv[2], int(sys.argv[3]), sys.argv[4],
                                                    sys.argv[5])))
