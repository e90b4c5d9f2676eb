"""The out-of-core engine over several processes (`jgrind.devices.ShardedOutOfCore` with
`jgrind.devices.across_processes`): two local processes of one CPU device each, joined by
`jax.distributed` (gloo), each with its own device, host and SSD tiers, against in-memory
training; host blocks stored in bfloat16 against its error bound.

One pair of processes runs every case and prints JSON (`_run_process`); the halo rows that
cross between the processes are counted and compared with a count made here from the graph's
edges. A run whose forward exchange is switched off must give another loss: the exchange is
what makes the result exact. A run stopped and resumed from its checkpoint ends as one that
was not, bit for bit (`_resumed`). Tolerances are tests/test_devices.py's.
"""

import os
import pathlib
import signal
import sys
import time

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from test_devices import (_environment, _gradient_error, _models,  # noqa: E402
                          _run_processes)

NUM_NODES, PARTS, EPOCHS = 1200, 6, 3


def _graph():
    from jgrind import generators
    return generators.csbm(num_nodes=NUM_NODES, num_features=8, avg_degree=6, seed=1)


def _policy(fate: str, folder: pathlib.Path) -> dict:
    """``host``: the default over devices (every block in host RAM, aggregations kept there
    for the backward steps); ``ssd``: every block on the SSD, aggregations recomputed (the
    backward steps gather their halo rows again); ``device``: every block on its partition's
    device (`policies.in_memory`); ``bfloat16``: ``host`` with activations and gradients
    stored in bfloat16."""
    from jgrind.devices.out_of_core import through_host_policy
    from jgrind.hostio import codecs
    from jgrind.plan import policies
    if fate == "host":
        return {"policy": through_host_policy()}
    if fate == "device":
        return {"policy": policies.in_memory()}
    if fate == "bfloat16":
        return {"policy": policies.with_storage(through_host_policy(),
                                                activations=codecs.bfloat16(),
                                                gradients=codecs.bfloat16())}
    folder.mkdir(parents=True, exist_ok=True)
    return {"policy": policies.ssd_offload(str(folder)), "store": str(folder)}


def _crossing_pairs(ex) -> int:
    """Distinct (node, reading process) pairs of edges whose ends run in two processes: the
    halo rows one layer boundary must move, counted from the normalised graph's edges."""
    pg = ex.engine.built.pg
    device_of = ex.placement.device_of
    process = np.array([ex.devices[int(d)].process_index for d in device_of])[pg.assignment]
    graph = ex.engine.built.given_model.normalize(_graph())
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    src = np.asarray(graph.indices)
    far = process[src] != process[dst]
    return int(np.unique(np.stack([src[far], process[dst][far]]), axis=1).shape[1])


def _words(ex, name: str, l: int) -> int:
    """Floats a crossing row of table ``(name, l)`` takes: its width, or where all its blocks
    are in host RAM or on the SSD in a lossy storage dtype, that dtype's stored words."""
    from jgrind.engine.store import CODED_TIERS
    plan = ex.engine.built.plan
    if all(f in CODED_TIERS for f in plan.layer_fates(name, l)):
        return plan.workload.storage.codec(name).words(plan.widths[l])
    return plan.widths[l]


def _boundaries(ex) -> int:
    """Floats per crossing row that an epoch's schedule moves: a layer's input (above the
    features) before every sweep that gathers it, its gradient after every sweep that
    scatter-adds it."""
    from jgrind.plan.fates import ACTIVATION, GRADIENT
    from jgrind.plan.schedule import ACTIVATIONS, BACKWARD
    plan = ex.engine.built.plan
    total = 0
    for sweep in plan.schedule.sweeps:
        l = sweep.layer
        total += sum(_words(ex, ACTIVATION, t.layer) for t in sweep.reads
                     if t.name == ACTIVATIONS and t.layer >= 1 and not plan.local[t.layer])
        if sweep.kind == BACKWARD and l >= 1 and not plan.local[l]:
            total += _words(ex, GRADIENT, l)
    return total


class _Recording:
    """An executor (``ex``) that keeps the state its last step returned: `jgrind.train.train`
    returns the parameters, not the optimizer state."""

    def __init__(self, ex):
        self.ex, self.state = ex, None

    def step(self, params, opt_state, key):
        params, opt_state, loss = self.ex.step(params, opt_state, key)
        self.state = (params, opt_state)
        return params, opt_state, loss

    def __getattr__(self, name):
        return getattr(self.ex, name)


def _resumed(ex, graph, model, optimizer, folder: pathlib.Path) -> dict:
    """`jgrind.train.train` with ``ex`` (dropout on, a checkpoint every epoch): 4 epochs
    straight, and 2 epochs then a second call resuming them to 4 (process 0 reads the
    checkpoint and sends the state to the other). Whether the two end with the same losses,
    and the same parameters and optimizer state in this process, bit for bit (dtype and
    shape included), and which leaves differ; and the line `jgrind train` prints of the bytes
    this process sent the others."""
    import jax

    from jgrind.experiment import devices_line
    from jgrind.train import train
    recording = _Recording(ex)

    def run(name: str, epochs: int):
        result = train(jax.random.key(5), graph, model, optimizer, epochs=epochs,
                       checkpoint_dir=folder / name, checkpoint_every=1, progress=False,
                       executor=recording)
        return result, recording.state

    straight, straight_state = run("straight", 4)
    run("resumed", 2)
    resumed, resumed_state = run("resumed", 4)
    leaves = jax.tree_util.tree_leaves_with_path(straight_state)
    differ = [jax.tree_util.keystr(path) for (path, a), b in
              zip(leaves, jax.tree.leaves(resumed_state))
              if not (np.asarray(a).dtype == np.asarray(b).dtype
                      and np.shape(a) == np.shape(b) and np.array_equal(a, b))]
    return {"first_epoch": resumed.first_epoch, "leaves": len(leaves), "differ": differ,
            "losses": [r["loss"] for r in straight.history],
            "resumed_losses": [r["loss"] for r in resumed.history],
            "lines": [line for line in devices_line(resumed.devices).splitlines()
                      if "between processes" in line],
            "share_line": [line for line in devices_line(resumed.devices).splitlines()
                           if "host share" in line],
            "host_share": resumed.devices.get("host_share"),
            "predicted_shares": [int(b) for b in ex.predicted_host_shares]}


def _host_budget_per_process(graph, model, host_case: dict) -> dict:
    """The host case again with a host budget between the processes' shares (each one's
    own blocks and the halo rows it keeps) and the whole plan's host bytes: its losses; and
    the refusal of a budget a byte below the smaller share."""
    import jax
    import optax

    from jgrind.devices import ShardedOutOfCore
    from jgrind.devices.out_of_core import through_host_policy
    from jgrind.engine.store import BudgetError
    shares, whole = host_case["host_shares"], host_case["host_whole"]
    budget = (max(shares) + whole) // 2
    out = {"shares": shares, "whole": whole, "budget": budget, "losses": []}
    opt = optax.adam(0.01)
    params = model.init(jax.random.key(0))
    state = opt.init(params)
    with ShardedOutOfCore(graph, model, opt, devices=2, num_parts=PARTS, max_shapes=1,
                          policy=through_host_policy(), host_budget=budget) as ex:
        for epoch in range(EPOCHS):
            key = jax.random.fold_in(jax.random.key(3), epoch)
            params, state, loss = ex.step(params, state, key)
            out["losses"].append(float(loss))
    try:
        ShardedOutOfCore(graph, model, opt, devices=2, num_parts=PARTS, max_shapes=1,
                         policy=through_host_policy(), host_budget=min(shares) - 1).close()
    except BudgetError as err:
        out["refused"] = str(err)
    return out


def _auto_over_processes(graph, model) -> dict:
    """`policies.auto` over the two processes, each given its own profile (process 1's twice
    as slow: the run plans with process 0's), under a device budget of the devices' working
    sets and a host budget between the larger process's share and the whole plan's host
    bytes (of the plan made with room to spare in host RAM): its losses, the plan's
    predicted epoch, the processes' shares by the plan and by the engine
    (`process_host_need`), the whole plan's host bytes and the fates."""
    import jax
    import optax

    from jgrind.devices import ShardedOutOfCore
    from jgrind.plan import policies
    from jgrind.plan.cost import Workload
    from jgrind.plan.planner import plan_run
    from jgrind.plan.sharded import scaled_profile
    from test_planner import fixed_profile
    profile = fixed_profile()
    placed = dict(num_parts=PARTS, devices=2, device_processes=[0, 1])
    # the devices' working sets, as planned and as the engine pads them (``max_shapes=1``)
    first = plan_run(graph, model, profile, **placed)
    padded = Workload.build(first.partitioned, model, max_shapes=1).on_devices(
        first.placement.device_of).device_working_sets()
    working_set = int(max(*first.prediction.memory.device_working_sets, *padded))
    roomy = plan_run(graph, model, profile, device_budget=working_set, host_budget=1 << 40,
                     **placed)
    budget = (max(b + h for b, h in roomy.host_shares) + roomy.prediction.memory.host) // 2
    own = profile if jax.process_index() == 0 else scaled_profile(profile, 0.5)
    opt = optax.adam(0.01)
    params = model.init(jax.random.key(0))
    state = opt.init(params)
    out = {"budget": budget, "losses": []}
    with ShardedOutOfCore(graph, model, opt, devices=2, num_parts=PARTS, max_shapes=1,
                          policy=policies.auto(profile=own), device_budget=working_set,
                          host_budget=budget) as ex:
        for epoch in range(EPOCHS):
            key = jax.random.fold_in(jax.random.key(3), epoch)
            params, state, loss = ex.step(params, state, key)
            out["losses"].append(float(loss))
        out.update(epoch_seconds=ex.plan.epoch_seconds,
                   plan_shares=[b + h for b, h in ex.plan.host_shares],
                   engine_shares=ex.predicted_host_shares, whole=ex.memory.host,
                   fates=sorted({f.value for f in ex.fates.values()}),
                   own_parts=len(ex.engine.runner.built.parts),
                   host_measured=ex.store.accounts.peak_host)
    return out


def _run_process(coordinator: str, process_id: int, folder: str) -> dict:
    """One of two processes of one CPU device: every case, as JSON-able results."""
    from jgrind.devices import processes
    processes.start(coordinator, 2, process_id, timeout_s=60, heartbeat_timeout_s=30)
    import jax
    import optax

    from jgrind.devices import ShardedOutOfCore, across_processes
    from jgrind.train import InMemory

    # every exchange in several collectives of a few rows (this graph's whole tables cross
    # in one of the default size): the chunks' rows must land where they belong
    across_processes.CHUNK_BYTES = 4096
    graph = _graph()
    built = _models(graph.num_features, graph.num_classes)
    mine = pathlib.Path(folder) / f"process{process_id}"
    out = {"process": jax.process_index(), "devices": len(jax.devices()), "cases": []}
    refused = {}
    from jgrind.devices.exchange import DeviceToDevice
    from jgrind.plan import policies
    for what, arguments in (("device to device", {"policy": policies.in_memory(),
                                                  "exchange": DeviceToDevice()}),):
        try:
            ShardedOutOfCore(graph, built["gcn"], optax.sgd(0.1), devices=2, num_parts=PARTS,
                             **arguments).close()
        except ValueError as err:
            refused[what] = str(err)
    out["refused"] = refused
    checks = jax.process_index() == 0  # the in-memory side runs in process 0 only
    for name, fate in (("gcn", "host"), ("sage-res-ln", "ssd"), ("gcn", "device"),
                       ("gcn", "bfloat16")):
        model = built[name]
        params = model.init(jax.random.key(0))
        opt = optax.adam(0.01)
        memory = InMemory(graph, model, opt) if checks else None
        with ShardedOutOfCore(graph, model, opt, devices=2, num_parts=PARTS, max_shapes=1,
                              **_policy(fate, mine / fate)) as ex:
            ours, ours_state = jax.tree.map(jax.numpy.array, params), opt.init(params)
            ref, ref_state = jax.tree.map(jax.numpy.array, params), opt.init(params)
            case = {"model": name, "fate": fate, "losses": [], "reference": []}
            for epoch in range(EPOCHS):
                key = jax.random.fold_in(jax.random.key(3), epoch)
                if epoch == 0:
                    _, grads = ex.loss_and_grad(ours, key)
                    if checks:
                        exact = memory.loss_and_grad(ref, key)[1]
                        case["gradient_error"] = _gradient_error(grads, exact)
                        # as tests/test_store_dtype.py measures a storage dtype's error
                        case["relative_error"] = max(
                            float(np.abs(np.asarray(g) - np.asarray(r)).max())
                            for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(exact))) \
                            / max(float(np.abs(np.asarray(r)).max())
                                  for r in jax.tree.leaves(exact))
                ours, ours_state, loss = ex.step(ours, ours_state, key)
                case["losses"].append(float(loss))
                # the tables of which other processes' rows are held between epochs
                case["held"] = sorted({key for key, tiers in ex.process_tiers.of_table.items()
                                       if any(t.holds_remote for t in tiers if t.live)})
                if checks:
                    ref, ref_state, ref_loss = memory.step(ref, ref_state, key)
                    case["reference"].append(float(ref_loss))
            logits = ex.predict(ours)  # (a collective: every process asks)
            case.update(tiers=sorted({f.value for f in ex.fates.values()}),
                        own_parts=len(ex.engine.runner.built.parts),
                        host_shares=ex.predicted_host_shares, host_whole=ex.memory.host,
                        host_measured=ex.store.accounts.peak_host,
                        exchanged=ex.process_exchange_bytes_per_epoch,
                        minimum=ex.process_exchange_minimum_per_epoch,
                        expected=4 * _crossing_pairs(ex) * _boundaries(ex),
                        params=[np.asarray(a).tolist() for a in jax.tree.leaves(ours)])
            if checks:
                case.update(params_close=all(
                    np.allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)
                    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref))),
                    logits_error=float(np.abs(logits - memory.predict(ref)).max()))
            if fate == "host":
                case["resume"] = _resumed(ex, graph, model, opt,
                                          pathlib.Path(folder) / f"checkpoints{process_id}")
                # the forward exchange switched off: the halo rows are zeros
                ex.row_exchange.rows = lambda name, layer, width: [
                    tier._remote_rows() for tier in ex.process_tiers.tiers((name, layer))]
                case["loss_without_exchange"] = float(ex.loss_and_grad(params, key)[0])
                if checks:
                    case["loss_with_exchange"] = float(memory.loss_and_grad(params, key)[0])
            out["cases"].append(case)
    out["budget"] = _host_budget_per_process(graph, built["gcn"], out["cases"][0])
    out["auto"] = _auto_over_processes(graph, built["gcn"])
    out["store_left"] = sorted(str(p.relative_to(mine)) for p in mine.rglob("*")
                               if p.is_file())
    return out


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """Both processes' JSON, in process order. Each takes about 30 s of CPU, most of it
    compiling; the limit is for a machine shared with other work."""
    folder = tmp_path_factory.mktemp("processes")
    return _run_processes(lambda coordinator, me: [sys.executable, __file__, "process",
                                                   coordinator, str(me), str(folder)],
                          _environment(1), timeout=900)


def _cases(two_processes, fate: str) -> list:
    return [next(c for c in r["cases"] if c["fate"] == fate) for r in two_processes]


@pytest.mark.parametrize("fate", ["host", "ssd", "device"])
def test_training_over_two_processes_equals_in_memory(two_processes, fate):
    assert [r["process"] for r in two_processes] == [0, 1]
    assert all(r["devices"] == 2 for r in two_processes)
    first, second = _cases(two_processes, fate)
    assert first["losses"] == pytest.approx(first["reference"], rel=1e-5)
    assert len(first["losses"]) == EPOCHS
    assert first["gradient_error"] <= 1.0
    assert first["params_close"]
    assert first["logits_error"] < 1e-4
    # the other process took the same steps: the same losses and parameters, bit for bit
    assert second["losses"] == first["losses"] and second["params"] == first["params"]
    for got in (first, second):  # (device: each process's blocks on its own device)
        assert fate in got["tiers"] and ("device" in got["tiers"]) == (fate == "device")
    # each process ran its own share of the partitions, together all of them
    shares = [first["own_parts"], second["own_parts"]]
    assert all(0 < s < PARTS for s in shares) and sum(shares) == PARTS


def test_each_process_keeps_the_others_rows_only_while_a_sweep_needs_them(two_processes):
    """Between epochs a process holds of the other's blocks only the features' halo rows:
    each layer's input rows were freed after the sweep that gathered them, each gradient's
    once sent to its owner, and a kept aggregation never had any."""
    for fate in ("host", "ssd", "device", "bfloat16"):
        for got in _cases(two_processes, fate):
            assert got["held"] == [["activation", 0]], (fate, got["held"])


def test_halo_rows_cross_between_the_processes_and_are_counted(two_processes):
    for fate in ("host", "ssd", "device", "bfloat16"):
        got = _cases(two_processes, fate)
        # each process sends the rows of its blocks the other reads, and the halo gradients
        # of the other's blocks: together every crossing row, at every layer boundary
        assert sum(g["exchanged"] for g in got) == got[0]["expected"] == got[1]["expected"]
        assert all(g["exchanged"] > 0 for g in got)
        # the least: every crossing row once forward and once back (host: what is sent; the
        # SSD policy recomputes the aggregations, and brings the rows again for that)
        assert all(g["exchanged"] >= g["minimum"] > 0 for g in got)
        if fate in ("host", "bfloat16"):
            assert all(g["exchanged"] == g["minimum"] for g in got)


def test_bfloat16_blocks_over_two_processes_within_the_format_bound(two_processes):
    """Host blocks stored in bfloat16: the rows cross in their stored words (half the
    float32 bytes: this GCN's widths are even), and the gradients' error against in-memory
    float32 training stays within tests/test_store_dtype.py's bound for bfloat16, as one
    process's does; not zero (the blocks were stored in bfloat16)."""
    from jgrind.hostio import codecs
    from test_store_dtype import _fan_in, gradient_bound
    first, second = _cases(two_processes, "bfloat16")
    exact = _cases(two_processes, "host")[0]
    assert 2 * sum(g["exchanged"] for g in (first, second)) == exact["expected"] \
        == 2 * first["expected"]
    bound = gradient_bound(codecs.bfloat16(), 2, _fan_in(_graph()))
    assert 0 < first["relative_error"] <= bound
    assert first["losses"] != first["reference"] and len(first["losses"]) == EPOCHS
    assert all(abs(a - b) <= bound * abs(b) for a, b in zip(first["losses"],
                                                             first["reference"]))
    # the other process took the same steps, bit for bit
    assert second["losses"] == first["losses"] and second["params"] == first["params"]
    assert first["tiers"] == ["host"]


def test_train_prints_the_bytes_each_process_sent_beside_the_minimum(two_processes):
    for got in _cases(two_processes, "host"):
        sent = got["exchanged"] / 2**20
        assert got["resume"]["lines"] == [f"halo exchange between processes per epoch: "
                                          f"{sent:.2f} MiB sent by this process, minimum "
                                          f"{sent:.2f} MiB (1.00x)"]


def test_train_prints_each_process_host_share_beside_its_prediction(two_processes):
    """A named policy over processes (no plan object) says this process's share of the host
    budget: its store's host peak beside the engine's predicted share."""
    for me, got in enumerate(_cases(two_processes, "host")):
        share = got["resume"]["host_share"]
        assert share["process"] == me
        assert share["predicted"] == got["resume"]["predicted_shares"][me] > 0
        assert 0 < share["measured"] <= share["predicted"]
        [line] = got["resume"]["share_line"]
        assert line.startswith(f"process {me}'s host share (its blocks and the halo rows "), line
        assert "measured peak / predicted: " in line, line


def test_without_the_exchange_the_loss_is_wrong(two_processes):
    first, second = _cases(two_processes, "host")
    assert first["loss_without_exchange"] == second["loss_without_exchange"]
    assert first["loss_without_exchange"] != pytest.approx(first["loss_with_exchange"],
                                                           rel=1e-4)


def test_a_resumed_run_ends_as_an_uninterrupted_one_bit_for_bit(two_processes):
    """4 epochs straight against 2 and a resume to 4, out of core (host tiers) with dropout:
    in every process the same losses, parameters and Adam state, dtype, shape and bits."""
    for got in _cases(two_processes, "host"):
        resume = got["resume"]
        assert resume["first_epoch"] == 2 and resume["leaves"] > 4
        assert resume["differ"] == []
        assert resume["resumed_losses"] == resume["losses"] and len(resume["losses"]) == 4
    first, second = (got["resume"] for got in _cases(two_processes, "host"))
    assert first["losses"] == second["losses"]


def test_the_state_process_0_sends_arrives_with_its_shapes_and_bits(monkeypatch):
    """What `jgrind.checkpoint` sends the other processes on resume, read back in one
    process: every array of the state with its dtype, shape (Adam's 0-d step count stays
    0-d) and bytes; a state of other shapes than the receiver's own is refused in one line."""
    import jax
    import optax

    from jgrind import checkpoint as ckpt
    params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5, "b": np.float32(-0.0)}
    state = {"params": params, "opt_state": optax.adam(0.1).init(params)}
    state = jax.tree.map(np.array, state)  # as process 0 restores it: NumPy, 0-d kept
    state["opt_state"][0].count[...] = 7
    monkeypatch.setattr(ckpt, "_writes", lambda: True)
    monkeypatch.setattr(ckpt, "_restore_latest_here", lambda *args: (3, state, {}))

    def sent_by_process_0():  # then read back as the others read them
        sent = []
        monkeypatch.setattr(ckpt, "_broadcast_bytes", lambda data: sent.append(data) or data)
        ckpt._from_process_zero(None, state, None)
        monkeypatch.setattr(ckpt, "_broadcast_bytes", lambda data: sent.pop(0))

    sent_by_process_0()
    epoch, got, _ = ckpt._received(state)
    assert epoch == 3 and jax.tree.structure(got) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(got)):
        assert (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes())
    assert np.signbit(got["params"]["b"])  # bytes, not values: -0.0 stays -0.0

    sent_by_process_0()
    other = jax.tree.map(np.atleast_1d, state)  # the receiver's own state: other shapes
    with pytest.raises(ckpt.CheckpointError, match=r"received from process 0 a state of "
                       r"other shapes than its own \(array 0: shape \[\], here \[1\]\)"):
        ckpt._received(other)


def test_the_host_budget_holds_each_process_share(two_processes):
    """A host budget below the whole plan's host bytes but above each process's share
    (its own partitions' blocks and the halo rows of the others' it keeps) trains as in
    memory; a byte below a process's share is refused there in one line naming it."""
    from jgrind.plan.cost import format_bytes
    first, second = (r["budget"] for r in two_processes)
    host = _cases(two_processes, "host")
    assert first["shares"] == second["shares"] and first["budget"] == second["budget"]
    assert max(first["shares"]) < first["budget"] < first["whole"]
    assert first["losses"] == pytest.approx(host[0]["reference"], rel=1e-5)
    assert second["losses"] == first["losses"]
    for me, got in enumerate((first, second)):
        need = got["shares"][me]
        assert got["refused"].startswith(f"this process's share of the plan keeps "
                                         f"{format_bytes(need)} in host RAM")
        assert "host budget per process is" in got["refused"] and "\n" not in got["refused"]
        # the store's measured host peak stays within the process's predicted share
        assert 0 < host[me]["host_measured"] <= need


def test_what_does_not_run_over_processes_is_refused_in_one_line(two_processes):
    for r in two_processes:
        refused = r["refused"]["device to device"]
        assert refused.startswith("halo rows go device to device within one process only")
        assert "\n" not in refused


def test_auto_over_two_processes_equals_in_memory_within_each_process_share(two_processes):
    """`auto` plans a run over the two processes: both plan the same run (process 0's
    profile, though process 1 was given a slower one), it trains as in memory, and the host
    budget holds each process's share (by the plan and by the engine alike), which a budget
    on the whole plan's host bytes would not."""
    first, second = (r["auto"] for r in two_processes)
    host = _cases(two_processes, "host")
    assert first["losses"] == pytest.approx(host[0]["reference"], rel=1e-5)
    assert second["losses"] == first["losses"] and len(first["losses"]) == EPOCHS
    assert second["epoch_seconds"] == first["epoch_seconds"]
    assert first["plan_shares"] == second["plan_shares"] == first["engine_shares"]
    assert max(first["plan_shares"]) <= first["budget"] < first["whole"]
    # host RAM only (the devices hold their working sets, no store given)
    assert first["fates"] == second["fates"] and "device" not in first["fates"]
    assert 0 < first["own_parts"] < PARTS and first["own_parts"] + second["own_parts"] == PARTS
    for me, got in enumerate((first, second)):
        assert 0 < got["host_measured"] <= got["plan_shares"][me]


def test_one_process_of_several_sizes_its_host_cache_by_its_share(tmp_path):
    """The store of one process of several (the engine built for ``own_parts``) gives the
    host cache and the freed tables' arrays what this process's share leaves of the host
    budget, not what the whole plan's host bytes leave; one process as before."""
    import optax

    from jgrind.engine import OutOfCore
    from jgrind.engine.build import process_host_need
    from jgrind.plan import policies
    graph = _graph()
    model = _models(graph.num_features, graph.num_classes)["gcn"]
    own = [0, 2, 4]

    def engine(**kwargs):
        return OutOfCore(graph, model, optax.adam(0.01), policy=policies.host_offload(),
                         num_parts=PARTS, max_shapes=1, **kwargs)
    with engine() as whole:
        m = whole.memory
        need = sum(process_host_need(whole.built.plan, whole.built.pg, own))
    assert need < m.host
    budget = (need + m.host) // 2
    with engine(own_parts=own, host_budget=budget) as mine:
        assert mine.store.cache.capacity == budget - need > 0
        assert mine.store.host_arrays.limit < m.stored_peaks[1]
    with engine(host_budget=m.host + 1000) as one:  # one process: the whole plan's bytes
        assert one.store.cache.capacity == 1000
        assert one.store.host_arrays.limit == m.stored_peaks[1]


def test_each_process_removes_its_store_files(two_processes):
    assert all(r["store_left"] == [] for r in two_processes)


def test_a_process_killed_mid_run_stops_the_other_with_one_line(tmp_path):
    """`jgrind train --policy host` in two processes (started as `jgrind launch` starts
    them), process 1 killed once process 0 has logged an epoch: process 0 stops within the
    heartbeat timeout and a few seconds, exit status 2, one line naming the failure (a
    collective failed, or the watchdog of `jgrind.devices.processes` saw process 1 silent)."""
    import subprocess

    from jgrind.devices import processes
    coordinator = f"127.0.0.1:{processes.free_port()}"
    out = tmp_path / "run"
    group = [subprocess.Popen(
        [sys.executable, "-m", "jgrind.cli", "train", "--dataset", "csbm", "--set",
         "num_nodes=300", "--set", "hidden=8", "--devices", "2", "--policy", "host",
         "--parts", "4", "--epochs", "100000", "--out", str(out), "--no-progress",
         "--coordinator", coordinator, "--num-processes", "2", "--process-id", str(me),
         "--heartbeat-timeout", "10"], env=_environment(1), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for me in range(2)]
    survivor, victim = group
    try:
        metrics = out / "metrics-seed0.jsonl"
        deadline = time.monotonic() + 600
        while not (metrics.exists() and metrics.read_text().strip()):
            assert time.monotonic() < deadline and survivor.poll() is None, \
                survivor.communicate(timeout=30)[1][-3000:]
            time.sleep(0.05)
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        _, err = survivor.communicate(timeout=60)
        stopped_after = time.monotonic() - killed
    finally:
        for p in group:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert survivor.returncode == processes.EXIT_FAILED, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("jgrind: error:")]
    # a collective in flight with the dead process fails first (about a second), else the
    # watchdog names the silent process
    assert len(errors) == 1 and ("another process has probably stopped" in errors[0]
                                 or "process 1 of 2 has shown no sign of life" in errors[0]), \
        err[-3000:]
    assert stopped_after < 10 + 20, stopped_after  # (a busy machine: some seconds more)


def _own_rows_process(coordinator: str, process_id: int, folder: str, scratch: str) -> dict:
    """One of two processes of one CPU device training on the saved graph in ``folder`` with
    contiguous partitions: what it read of the saved edges, and its losses and partitions."""
    from jgrind.devices import processes
    processes.start(coordinator, 2, process_id, timeout_s=60, heartbeat_timeout_s=30)
    import jax
    import optax

    from jgrind.datasets import load
    from jgrind.datasets.saved_arrays import SavedGraph
    from jgrind.devices import ShardedOutOfCore
    from jgrind.partition import partition_graph
    from jgrind.partition.partitioners import contiguous
    from jgrind.train import InMemory

    out = {"process": jax.process_index(), "cases": []}
    checks = jax.process_index() == 0  # the in-memory side runs in process 0 only
    for name in ("gcn", "sage-res-ln"):
        graph = SavedGraph.open(folder)
        model = _models(graph.num_features, graph.num_classes)[name]
        opt = optax.adam(0.01)
        params = model.init(jax.random.key(0))
        store = pathlib.Path(scratch) / f"{name}{process_id}"
        with ShardedOutOfCore(graph, model, opt, devices=2, num_parts=4,
                              partitioner=contiguous, max_shapes=1, **_policy("ssd", store)
                              ) as ex:
            pg = ex.engine.built.pg
            case = {"model": name, "read": dict(graph.saved.read),
                    "num_edges": graph.saved.num_edges,
                    "process_of_part": [int(ex.devices[int(d)].process_index)
                                        for d in ex.placement.device_of],
                    "assignment": np.asarray(pg.assignment).tolist()}
            ours, case["losses"] = _two_epochs(ex.step, params, opt)
            case["params"] = [np.asarray(a).tolist() for a in jax.tree.leaves(ours)]
            # every partition as the whole normalised graph's partitioning has it
            whole = model.normalize(load(f"npy:{folder}"))
            reference = partition_graph(whole, pg.assignment, num_parts=pg.num_parts)
            case["same_partitions"] = all(
                np.array_equal(a.owned, b.owned) and np.array_equal(a.halo, b.halo)
                and np.array_equal(a.halo_owner, b.halo_owner)
                and np.array_equal(a.halo_row, b.halo_row) and a.num_edges == b.num_edges
                for a, b in zip(pg.partitions, reference.partitions))
        if checks:
            memory = InMemory(load(f"npy:{folder}"), model, opt)
            _, case["reference"] = _two_epochs(memory.step, params, opt)
        out["cases"].append(case)
    return out


def _two_epochs(step, params, opt) -> tuple:
    """The parameters and the losses of two training steps of ``step`` (an executor's) from
    ``params``, with the keys every run here uses."""
    import jax
    ours, state, losses = jax.tree.map(jax.numpy.array, params), opt.init(params), []
    for epoch in range(2):
        ours, state, loss = step(ours, state, jax.random.fold_in(jax.random.key(3), epoch))
        losses.append(float(loss))
    return ours, losses


@pytest.fixture(scope="module")
def own_rows_processes(tmp_path_factory):
    """The saved graph and both processes' JSON (`_own_rows_process`), in process order."""
    from jgrind import generators
    from jgrind.datasets import save_graph
    root = tmp_path_factory.mktemp("own_rows")
    folder = save_graph(generators.csbm(num_nodes=600, num_features=8, avg_degree=6,
                                        seed=2), root / "graph")
    script = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
              "import test_processes_out_of_core as t; "
              "print(json.dumps(t._own_rows_process(sys.argv[2], int(sys.argv[3]), "
              "sys.argv[4], sys.argv[5])))")
    return folder, _run_processes(
        lambda coordinator, me: [sys.executable, "-c", script, str(HERE), coordinator,
                                 str(me), str(folder), str(root)],
        _environment(1), timeout=900)


def test_each_process_reads_only_its_own_partitions_edges(own_rows_processes):
    """On a saved graph with contiguous partitions, each process reads of the saved edges the
    in-edges of its own partitions' rows only (counted by `SavedArrays.read`), learns the
    other partitions' halos from their processes, and still trains as in memory."""
    from jgrind.datasets.saved_arrays import SavedArrays
    folder, results = own_rows_processes
    saved = SavedArrays(folder)
    saved_degree = np.diff(saved.indptr)
    cases = {name: [next(c for c in r["cases"] if c["model"] == name) for r in results]
             for name in ("gcn", "sage-res-ln")}
    for name, (first, second) in cases.items():
        assert first["losses"] == pytest.approx(first["reference"], rel=1e-5), name
        assert second["losses"] == first["losses"] and second["params"] == first["params"]
        process_of_part = np.array(first["process_of_part"])
        assert sorted(set(process_of_part.tolist())) == [0, 1]
        for process, case in enumerate((first, second)):
            mine = process_of_part[np.array(case["assignment"])] == process
            own_edges = int(saved_degree[mine].sum())
            assert 0 < own_edges < saved.num_edges
            # its own rows' in-edges, each once, and no other edge
            assert case["read"].get("indices") == own_edges, (name, process, case["read"])
            # every partition, the others' included, as the whole graph's partitioning
            assert case["same_partitions"], (name, process)


def _auto_budgets(folder) -> dict:
    """What `_own_rows_auto_process` plans with, made here from the whole saved graph: the
    profile's, a device budget of the devices' working sets (as planned and as the engine
    pads them) and a host budget of 0.6 of the larger process's share of a plan with room to
    spare, which sends some blocks to the SSD and keeps others in host RAM; and the
    contiguous partitions and their placement the processes must make."""
    from jgrind.datasets import load
    from jgrind.datasets.saved_arrays import SavedArrays
    from jgrind.devices import local
    from jgrind.partition import partition_graph
    from jgrind.partition.partitioners import contiguous
    from jgrind.plan.cost import Workload
    from jgrind.plan.placement import Rates
    from jgrind.plan.planner import plan_run
    from test_planner import fixed_profile
    saved, graph = SavedArrays(folder), load(f"npy:{folder}")
    model = _models(graph.num_features, graph.num_classes)["gcn"]
    profile = fixed_profile()
    assignment = local.local_assignment(saved, contiguous, 4, 2)
    placement = local.degree_placement(saved, model, assignment, 2, Rates.of(profile))
    pg = partition_graph(model.normalize(graph), assignment, num_parts=4)
    placed = dict(partitioned=pg, placement=placement, devices=2, device_processes=[0, 1],
                  recompute=False)
    first = plan_run(graph, model, profile, **placed)
    padded = Workload.build(pg, model, max_shapes=1).on_devices(
        placement.device_of).device_working_sets()
    working_set = int(max(*first.prediction.memory.device_working_sets, *padded))
    roomy = plan_run(graph, model, profile, device_budget=working_set, host_budget=1 << 40,
                     **placed)
    host_budget = int(0.6 * max(b + h for b, h in roomy.host_shares))
    return {"device_budget": working_set, "host_budget": host_budget,
            "graph": graph, "model": model, "profile": profile, "placed": placed}


def _own_rows_auto_process(coordinator: str, process_id: int, folder: str, scratch: str,
                           device_budget: int, host_budget: int) -> dict:
    """One of two processes of one CPU device training on the saved graph in ``folder`` with
    contiguous partitions and `policies.auto` (no recomputation) under the given budgets,
    each process with its own store: what it read of the saved edges, its plan, losses and
    partitions."""
    from jgrind.devices import processes
    processes.start(coordinator, 2, process_id, timeout_s=60, heartbeat_timeout_s=30)
    import jax
    import optax

    from jgrind.datasets import load
    from jgrind.datasets.saved_arrays import SavedGraph
    from jgrind.devices import ShardedOutOfCore
    from jgrind.partition.partitioners import contiguous
    from jgrind.plan import policies
    from jgrind.plan.process_shares import plan_fingerprint
    from jgrind.train import InMemory
    from test_planner import fixed_profile

    graph = SavedGraph.open(folder)
    model = _models(graph.num_features, graph.num_classes)["gcn"]
    opt = optax.adam(0.01)
    params = model.init(jax.random.key(0))
    store = pathlib.Path(scratch) / f"auto{process_id}"
    store.mkdir(parents=True, exist_ok=True)
    with ShardedOutOfCore(graph, model, opt, devices=2, num_parts=4, partitioner=contiguous,
                          max_shapes=1, policy=policies.auto(profile=fixed_profile(),
                                                             recompute=False),
                          store=str(store), device_budget=device_budget,
                          host_budget=host_budget) as ex:
        out = {"process": jax.process_index(), "read": dict(graph.saved.read),
               "fingerprint": plan_fingerprint(ex.plan),
               "epoch_seconds": ex.plan.epoch_seconds, "num_parts": ex.plan.num_parts,
               "plan_fates": sorted({f.value for f in ex.plan.fates().values()}),
               "fates": sorted({f.value for f in ex.fates.values()}),
               "device_of": np.asarray(ex.placement.device_of).tolist(),
               "process_of_part": [int(ex.devices[int(d)].process_index)
                                   for d in ex.placement.device_of],
               "assignment": np.asarray(ex.engine.built.pg.assignment).tolist(),
               "own_parts": len(ex.engine.runner.built.parts)}
        ours, out["losses"] = _two_epochs(ex.step, params, opt)
        out["params"] = [np.asarray(a).tolist() for a in jax.tree.leaves(ours)]
    if jax.process_index() == 0:  # the in-memory side, once the reads are counted
        memory = InMemory(load(f"npy:{folder}"), model, opt)
        _, out["reference"] = _two_epochs(memory.step, params, opt)
    return out


@pytest.fixture(scope="module")
def own_rows_auto_processes(tmp_path_factory):
    """The saved graph (`own_rows_processes`'), the budgets (`_auto_budgets`) and both
    processes' JSON (`_own_rows_auto_process`), in process order."""
    from jgrind import generators
    from jgrind.datasets import save_graph
    root = tmp_path_factory.mktemp("own_rows_auto")
    folder = save_graph(generators.csbm(num_nodes=600, num_features=8, avg_degree=6,
                                        seed=2), root / "graph")
    budgets = _auto_budgets(folder)
    script = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
              "import test_processes_out_of_core as t; "
              "print(json.dumps(t._own_rows_auto_process(sys.argv[2], int(sys.argv[3]), "
              "sys.argv[4], sys.argv[5], int(sys.argv[6]), int(sys.argv[7]))))")
    return folder, budgets, _run_processes(
        lambda coordinator, me: [sys.executable, "-c", script, str(HERE), coordinator,
                                 str(me), str(folder), str(root),
                                 str(budgets["device_budget"]), str(budgets["host_budget"])],
        _environment(1), timeout=900)


def test_auto_over_processes_reads_only_its_own_partitions_edges(own_rows_auto_processes):
    """`auto` over two processes on a saved graph with contiguous partitions: each process
    reads of the saved edges the in-edges of its own partitions' rows only, both plan the
    run over those partitions, the plan one process makes over the same partitions,
    placement, profile and budgets (which keep some blocks in host RAM and send others to
    the SSD), and it trains as in memory."""
    from jgrind.datasets.saved_arrays import SavedArrays
    from jgrind.plan.planner import plan_run
    from jgrind.plan.process_shares import plan_fingerprint
    folder, budgets, (first, second) = own_rows_auto_processes
    saved = SavedArrays(folder)
    saved_degree = np.diff(saved.indptr)
    placed = budgets["placed"]
    for process, got in enumerate((first, second)):
        mine = np.array(got["process_of_part"])[np.array(got["assignment"])] == process
        own_edges = int(saved_degree[mine].sum())
        assert 0 < own_edges < saved.num_edges
        # its own rows' in-edges, each once, and no other edge
        assert got["read"].get("indices") == own_edges, (process, got["read"])
        assert 0 < got["own_parts"] < 4
    assert first["own_parts"] + second["own_parts"] == 4
    # the partitions and placement the whole graph's would be, and the plan made over them
    # in one process with the same profile and budgets
    assert first["assignment"] == np.asarray(placed["partitioned"].assignment).tolist()
    assert first["device_of"] == second["device_of"] \
        == np.asarray(placed["placement"].device_of).tolist()
    alone = plan_run(budgets["graph"], budgets["model"], budgets["profile"],
                     device_budget=budgets["device_budget"],
                     host_budget=budgets["host_budget"], directory=str(folder), **placed)
    assert first["fingerprint"] == second["fingerprint"] == plan_fingerprint(alone)
    assert first["epoch_seconds"] == second["epoch_seconds"] == alone.epoch_seconds
    assert first["num_parts"] == 4
    assert first["plan_fates"] == ["host", "ssd"] == second["plan_fates"]
    for got in (first, second):
        assert "host" in got["fates"] and "ssd" in got["fates"]
    assert first["losses"] == pytest.approx(first["reference"], rel=1e-5)
    assert second["losses"] == first["losses"] and second["params"] == first["params"]


if __name__ == "__main__":
    print(__import__("json").dumps(_run_process(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
