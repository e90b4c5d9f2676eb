"""What the benchmarks in tools/ share: their arguments, the graph, model, partitioning and
policy built from them, an epoch loop, child processes that answer in JSON, the machine line
and the JSON results file.

A script adds the arguments it takes, with its own defaults (so that every command line in the
docs keeps its flags), then builds from what was parsed::

    p = argparse.ArgumentParser()
    harness.add_source(p, rmat=(1_000_000, 10_000_000))     # --rmat NODES EDGES
    harness.add_policy(p, default="host")
    harness.add_parts(p, default=8)
    harness.add_store(p)
    args = p.parse_args()
    graph, model, _ = harness.graph_and_model(rmat=args.rmat)
    executor = OutOfCore(graph, model, optimizer, partitioned=harness.partition(
        graph, model, args.parts), policy=harness.policy(args.policy, args.store))
    training = harness.Training(executor, model, optimizer)
    seconds, loss = training.epoch(jax.random.key(0))

The graphs: an R-MAT graph (`jgrind.generators.rmat`, seed 0: 128 features, 47 classes) trained
by a 3-layer GCN (hidden 256, dropout 0.5), or one of the planner benchmark's configurations
(`CONFIGS`: a CSBM graph, its model and budgets).

tools/ is not a package: a script imports this as ``harness`` (Python puts the script's own
folder first on its path; tests put tools/ there). jgrind, and with it JAX, is imported only
inside the functions that use it: a script may first have to re-launch itself
(`jgrind.hostio.allocator.relaunch_if_wanted`) or keep its process off the GPU (``JAX_PLATFORMS``,
read when JAX is imported).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Optional

import numpy as np

GiB, MiB = 1 << 30, 1 << 20
FEATURES, CLASSES, HIDDEN = 128, 47, 256
SKEW = "0.57,0.19,0.19"  # R-MAT's quadrant probabilities a, b, c: `jgrind.generators.rmat`'s
POLICIES = ("device", "host", "ssd", "recompute")


# -- the planner benchmark's configurations ------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    nodes: int
    avg_degree: float
    features: int
    hidden: int
    layers: int
    model: str
    device_budget: int
    host_budget: int
    store: bool  # an SSD store directory is available
    purpose: str


# Budgets are chosen from the stored bytes of each configuration to force each tier; the
# "purpose" column says which. Sizes keep every run to a few seconds per epoch on 2 cores.
CONFIGS = (
    Config("fits", 60_000, 10, 64, 128, 3, "gcn", 2 * GiB, 2 * GiB, True,
           "everything fits on the device: the fast path"),
    Config("device-tight", 150_000, 10, 64, 128, 3, "gcn", 40 * MiB, 2 * GiB, True,
           "the device holds part of the blocks; host RAM the rest"),
    Config("host-tight", 150_000, 10, 64, 128, 3, "gcn", 24 * MiB, 160 * MiB, True,
           "device and host full: part of the blocks on SSD"),
    Config("ssd", 200_000, 10, 64, 256, 3, "gcn", 48 * MiB, 32 * MiB, True,
           "almost everything on SSD"),
    Config("no-ssd", 150_000, 10, 64, 256, 3, "gcn", 48 * MiB, 700 * MiB, False,
           "no SSD store: device, host RAM or recompute"),
    Config("deep-sage", 100_000, 12, 64, 128, 4, "sage", 32 * MiB, 200 * MiB, True,
           "4-layer GraphSAGE, device and host partly full"),
    Config("wide", 120_000, 8, 128, 512, 3, "gcn", 96 * MiB, 1 * GiB, True,
           "wide hidden layers: host offload with a large working set"),
)


def planner_config(name: str) -> Optional[Config]:
    """The configuration called ``name``, or None."""
    return next((c for c in CONFIGS if c.name == name), None)


def build_config(cfg: Config):
    """``cfg``'s graph (CSBM, 8 classes, seed 0) and model."""
    from jgrind.generators import csbm
    from jgrind.models.model import gcn, sage
    graph = csbm(num_nodes=cfg.nodes, num_features=cfg.features, avg_degree=cfg.avg_degree,
                 num_classes=8, seed=0)
    make = gcn if cfg.model == "gcn" else sage
    model = make(graph.num_features, cfg.hidden, graph.num_classes, num_layers=cfg.layers,
                 dropout=0.5)
    return graph, model


# -- arguments -----------------------------------------------------------------------------
def add_source(parser, *, rmat=None, config: bool = False) -> None:
    """``--rmat NODES EDGES`` (default ``rmat``) and, with ``config``, ``--config NAME`` (a
    planner configuration) as its alternative, one of the two required."""
    if config:
        group = parser.add_mutually_exclusive_group(required=True)
        group.add_argument("--config", choices=[c.name for c in CONFIGS],
                           help="a tools/bench_planner.py configuration (graph, model, budgets)")
    else:
        group = parser
    group.add_argument("--rmat", nargs=2, type=int, metavar=("NODES", "EDGES"),
                       default=None if config else rmat,
                       help="an R-MAT graph (seed 0) and a 3-layer GCN on it")


def add_graph_size(parser, *, nodes: int, edges: int) -> None:
    """The R-MAT graph by its parts: ``--nodes --edges --features --classes --tasks --skew``."""
    parser.add_argument("--nodes", type=int, default=nodes)
    parser.add_argument("--edges", type=int, default=edges)
    add_features(parser)
    parser.add_argument("--classes", type=int, default=CLASSES)
    parser.add_argument("--tasks", type=int, default=0,
                        help="binary targets per node: a multi-label task trained with binary "
                             "cross entropy (0: one class per node)")
    parser.add_argument("--skew", default=SKEW,
                        help="R-MAT quadrant probabilities a,b,c (more even for denser graphs)")


def add_features(parser, default: int = FEATURES) -> None:
    parser.add_argument("--features", type=int, default=default)


def add_hidden(parser, default: int = HIDDEN) -> None:
    parser.add_argument("--hidden", type=int, default=default)


def add_parts(parser, default: Optional[int] = 8, help: Optional[str] = None) -> None:
    parser.add_argument("--parts", type=int, default=default, help=help)


def add_policy(parser, choices=POLICIES, default: Optional[str] = None) -> None:
    """``--policy``, one of ``choices`` (required where there is no default)."""
    parser.add_argument("--policy", choices=choices, default=default, required=default is None)


def add_budgets(parser, *, device: bool = True, host: bool = True, defaults=(None, None),
                help: str = "bytes, e.g. 2GiB or 419430400") -> None:
    """``--device-budget`` / ``--host-budget``, read by `jgrind.config.parse_bytes`."""
    for name, wanted, default in (("device", device, defaults[0]), ("host", host, defaults[1])):
        if wanted:
            parser.add_argument(f"--{name}-budget", type=_bytes, default=default,
                                help=help + (" (0: host cache off)" if name == "host" else ""))


def add_epochs(parser, default: int, help: Optional[str] = None) -> None:
    parser.add_argument("--epochs", type=int, default=default, help=help)


def add_store(parser, default: Optional[str] = None,
              help: str = "SSD tier directory") -> None:
    parser.add_argument("--store", default=tempfile.gettempdir() if default is None else default,
                        help=help)


def add_json(parser) -> None:
    parser.add_argument("--json", help="also write the results here")


def _bytes(text: str) -> int:
    from jgrind.config import ConfigError, parse_bytes
    try:
        return parse_bytes(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


# -- graph, model, partitioning, policy ----------------------------------------------------
def skew(text: str) -> dict:
    """``--skew a,b,c`` as `jgrind.generators.rmat`'s keyword arguments."""
    values = [float(v) for v in text.split(",")]
    if len(values) != 3:
        raise SystemExit(f"--skew takes three probabilities a,b,c (d is the rest), got {text!r}")
    return dict(zip("abc", values))


def rmat_graph(nodes: int, edges: int, features: int = FEATURES, classes: int = CLASSES,
               tasks: int = 0, skew_text: str = SKEW):
    """The benchmarks' R-MAT graph (seed 0)."""
    from jgrind.generators import rmat
    return rmat(num_nodes=nodes, num_edges=edges, num_features=features, num_classes=classes,
                num_tasks=tasks, seed=0, **skew(skew_text))


def gcn(features: int = FEATURES, classes: int = CLASSES, hidden: int = HIDDEN):
    """The benchmarks' model: a 3-layer GCN, ReLU, dropout 0.5."""
    from jgrind import models
    return models.gcn(features, hidden, classes, num_layers=3, dropout=0.5)


def graph_and_model(config: Optional[str] = None, rmat=None, features: int = FEATURES,
                    hidden: int = HIDDEN):
    """``(graph, model, config)``: the planner configuration named ``config``, or else an R-MAT
    graph of ``rmat = (nodes, edges)`` and its GCN (`add_source`'s arguments); the
    configuration None for an R-MAT graph."""
    if config:
        cfg = planner_config(config)
        return (*build_config(cfg), cfg)
    graph = rmat_graph(*rmat, features=features)
    return graph, gcn(features, CLASSES, hidden), None


def partition(graph, model, parts: int):
    """``graph`` normalised for ``model`` and cut into ``parts`` by label propagation (seed
    0), as every out-of-core benchmark runs unless it says otherwise."""
    from jgrind.partition import partition_graph
    from jgrind.partition.partitioners import label_propagation
    normalized = model.normalize(graph)
    return partition_graph(normalized, label_propagation(normalized, parts, seed=0),
                           num_parts=parts)


def policy(name: str, store: str):
    """The built-in policy ``name`` (`POLICIES`); ``grinnder``: None, the engine's default
    (grinnder over the run's budgets)."""
    from jgrind.plan import policies
    return {"device": policies.in_memory, "host": policies.host_offload,
            "ssd": lambda: policies.ssd_offload(store),
            "recompute": policies.recompute_activations,
            "grinnder": lambda: None}[name]()


# -- epochs --------------------------------------------------------------------------------
class Training:
    """One executor's parameters and optimizer state, carried from epoch to epoch."""

    def __init__(self, executor, model, optimizer, seed: int = 0):
        import jax
        self.executor = executor
        self.params = model.init(jax.random.key(seed))
        self.opt_state = optimizer.init(self.params)

    def epoch(self, key) -> tuple[float, object]:
        """One epoch under ``key``: its seconds, until the parameters and loss are ready, and
        its loss (a JAX scalar)."""
        import jax
        start = time.perf_counter()
        self.params, self.opt_state, loss = self.executor.step(self.params, self.opt_state, key)
        jax.block_until_ready((self.params, loss))
        return time.perf_counter() - start, loss


class PricedSweeps:
    """An out-of-core executor's epochs, each sweep's measured seconds and parts beside the cost
    model's price of it (`jgrind.plan.check.engine_prediction` under ``profile``): for the
    tools that hold one kind of sweep against its price (bench_accumulate, bench_gathers).
    Prints the command line and the machine first."""

    def __init__(self, executor, model, graph, optimizer, profile):
        from jgrind.plan.check import engine_prediction
        from jgrind.plan.inventory import layer_widths
        from jgrind.plan.planner import dense_parameter_count
        self.executor = executor
        self.training = Training(executor, model, optimizer)
        print(f"# {command()}\n# {machine()}", flush=True)
        self.prediction = engine_prediction(
            executor, dense_parameter_count(layer_widths(model, graph.num_features)), profile)
        self.priced = {s.label: s for s in self.prediction.sweeps}

    def step(self, key) -> None:
        """One epoch under ``key``, until its parameters and loss are ready."""
        self.training.epoch(key)

    def epochs(self, count: int):
        """``count`` epochs after one that compiles: ``(epoch, label, seconds, parts, priced)``
        for every sweep the prediction prices (``parts``: `SweepTiming`'s record of it)."""
        import jax
        for e in range(count + 1):
            self.step(jax.random.key(e))
            if not e:
                continue
            runner = self.executor.runner
            parts = dict(zip((label for label, _ in runner.sweep_seconds),
                             getattr(runner, "sweep_parts", [])))
            for label, seconds in runner.sweep_seconds:
                if label in self.priced:
                    yield e, label, seconds, parts.get(label, {}), self.priced[label]


# -- processes and memory ------------------------------------------------------------------
class DeviceInUse:
    """The most device memory in use in each window of a run, sampled every ``interval``
    seconds from the allocator (`jax.Device.memory_stats`'s ``bytes_in_use``).

    The allocator's own ``peak_bytes_in_use`` covers the whole process, the first epoch's
    compilation and autotuning included; a window per epoch tells the steps' own peak from
    that. A sample can miss a spike shorter than the interval. On the CPU backend there are no
    allocator statistics and every window is None.
    """

    def __init__(self, interval: float = 0.002):
        import jax
        self._device = jax.devices()[0]
        stats = self._device.memory_stats() if self._device.platform != "cpu" else None
        self.enabled = bool(stats) and "bytes_in_use" in stats
        self._most, self._stop = 0, None
        if self.enabled:
            import threading
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, args=(interval,),
                                            name="device-in-use", daemon=True)
            self._thread.start()

    def _sample(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._most = max(self._most, self._device.memory_stats()["bytes_in_use"])

    def window(self) -> Optional[int]:
        """The most bytes in use since the last call (or the start), and a new window."""
        if not self.enabled:
            return None
        most = max(self._most, self._device.memory_stats()["bytes_in_use"])
        self._most = 0
        return most

    def close(self) -> None:
        if self._stop is not None:
            self._stop.set()


def run_child(cmd: list, what: str, env: Optional[dict] = None) -> dict:
    """Run ``cmd``, whose last line of output is its JSON result; SystemExit with the end of
    its stderr if it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def peak_rss() -> int:
    """This process's peak resident bytes so far (``ru_maxrss``, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def resident(field: str = "VmRSS") -> int:
    """A ``/proc/self/status`` figure in bytes (``VmRSS``; ``VmHWM``: the peak; ``RssAnon``:
    anonymous memory); 0 where there is none."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def save_npz(graph, path: str) -> None:
    """The parts of ``graph`` a benchmark's children train on, for `load_npz`."""
    np.savez(path, indptr=graph.indptr, indices=graph.indices, features=graph.features,
             labels=graph.labels, train_mask=graph.train_mask[0], num_classes=graph.num_classes)


def read_npz(path: str) -> dict:
    with np.load(path) as d:
        return {k: d[k] for k in d.files}


def load_npz(path: str):
    """A graph saved by `save_npz` (every training label, no validation or test nodes)."""
    from jgrind.graph import Graph
    d = read_npz(path)
    n = d["indptr"].size - 1
    return Graph(indptr=d["indptr"], indices=d["indices"], features=d["features"],
                 labels=d["labels"], train_mask=d["train_mask"], val_mask=np.zeros(n, bool),
                 test_mask=np.zeros(n, bool), num_classes=int(d["num_classes"]))


# -- output --------------------------------------------------------------------------------
def ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gpus() -> str:
    """The NVIDIA GPUs, from nvidia-smi: asked here, not through JAX, because initialising
    JAX's GPU backend in a parent process would take GPU memory from its children (its
    allocator reserves most of the card)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return "; ".join(line.strip() for line in out.stdout.splitlines() if line.strip()) \
        if out.returncode == 0 else ""


def machine() -> str:
    """Cores, RAM, GPUs and glibc allocator settings, for a results header."""
    from jgrind.hostio import allocator
    gpu = gpus()
    return (f"{os.cpu_count()} cores, {ram_bytes() / 2**30:.1f} GiB RAM, "
            f"{'GPU ' + gpu if gpu else 'no GPU'}, {allocator.summary()}")


def write_json(path: Optional[str], results) -> None:
    """``results`` into ``path`` (``--json``), if one was given."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=2, default=str)


def command() -> str:
    """This process's command line, as a shell would take it."""
    return shlex.join([sys.executable] + sys.argv)
