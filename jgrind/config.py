"""`RunConfig`: one typed, frozen description of a training run, as the CLI and experiments use it.

The string names here ("gcn", "relu", "cora") are resolved to functions once, in `build_model`,
`build_optimizer` and `load_graph`; nothing downstream tests strings.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Optional
import jax
import jax.numpy as jnp
import optax

from jgrind.graph import Graph
from jgrind.models.model import GNN, gat, gcn, rgat, rgcn, sage
from jgrind.plan.budgets import UNLIMITED


class ConfigError(ValueError):
    """A configuration value is unknown or malformed."""


# other names of the ``policy`` setting's values: the functions of `jgrind.plan.policies`
POLICY_ALIASES = {"host_offload": "host", "ssd_offload": "ssd",
                  "recompute_activations": "recompute"}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every knob of a run. Field docs are shown by ``jgrind train --help``."""

    dataset: str = "csbm"
    "dataset name (see `jgrind datasets`), ogb:DIR for an OGB raw directory"
    model: str = "gcn"
    "gcn | sage | gat | rgcn | rgat (rgcn, rgat: a weight per relation of the graph)"
    hidden: int = 64
    "hidden width (GAT: per head)"
    layers: int = 2
    "number of message-passing layers"
    heads: int = 8
    "GAT attention heads in hidden layers"
    output_heads: int = 1
    "GAT attention heads in the output layer (averaged)"
    attention_dropout: float = -1.0
    "GAT dropout on attention coefficients (-1 = as dropout)"
    num_bases: int = 0
    "R-GCN: relation weights as combinations of this many shared bases (0 = one per relation)"
    num_blocks: int = 0
    "R-GCN: block-diagonal relation weights of this many blocks (0 = dense)"
    dropout: float = 0.5
    "dropout rate on every layer's input (GAT: also on attention, unless attention_dropout)"
    residual: bool = False
    "residual blocks with input/output projections (Platonov et al. 2023)"
    layer_norm: bool = False
    "LayerNorm before each layer"
    activation: str = "relu"
    "relu | elu | gelu | tanh"
    optimizer: str = "adam"
    "adam | adamw | sgd (momentum 0.9)"
    lr: float = 0.01
    "learning rate (the peak, with a schedule)"
    weight_decay: float = 5e-4
    "adam, sgd: L2 penalty added to the gradient (PyTorch's weight_decay); adamw: decoupled"
    lr_schedule: str = "constant"
    "constant | cosine (decays toward 0 over the run's epochs)"
    warmup_epochs: int = 0
    "epochs of linear warm-up to lr (from lr / (warmup_epochs + 1))"
    epochs: int = 200
    "training epochs (one full-graph optimizer step each)"
    seed: int = 0
    "first seed; trials use seed, seed+1, ..."
    seeds: int = 1
    "number of seeds to run (mean +- std is reported)"
    split: int = -1
    "which split of the dataset's masks; -1 = one per seed for multi-split datasets, else 0"
    patience: int = 0
    "early stopping patience in evaluations (0 = off)"
    label_smoothing: float = 0.0
    "cross entropy against targets smoothed toward uniform by this much (0 = off)"
    multilabel_loss: str = "node_mean"
    ("multi-label tasks: binary cross entropy averaged over each node's known targets, then "
     "nodes (node_mean), or over all known (node, target) pairs of the training set "
     "(pair_mean: torch's BCEWithLogitsLoss on the known entries)")
    pos_weight: str = "none"
    ("multi-label tasks: weight of each task's positive targets in the loss (torch's "
     "pos_weight): none, auto (the training set's negatives per positive, task by task) or "
     "one number for every task")
    metric: str = ""
    ("what evaluations score and val selects by: accuracy | roc_auc | micro_f1 | macro_f1 "
     "('' = the dataset's benchmark metric, macro_f1 for dblp; else roc_auc for binary and "
     "multi-label tasks, else accuracy)")
    select: str = "val"
    "what picks the best epoch and what patience watches: val (metric) | val_loss"
    min_delta: float = 0.0
    "an evaluation beats the best only by more than this"
    eval_every: int = 1
    "evaluate on val/test every N epochs"
    row_normalize: bool = False
    "row-normalise features (Kipf & Welling do this for Planetoid)"
    checkpoint_every: int = 0
    "save an orbax checkpoint every N epochs (0 = off); an existing one is resumed"
    check_in_memory: bool = False
    ("after an out-of-core run, train its first seed again in memory, without budgets, and "
     "print whether the final training losses agree")
    policy: str = ""
    ("in_memory | host | ssd | recompute | grinnder | auto ('' = in memory, or grinnder if a "
     "budget is set)")
    keep_aggregations: str = ""
    ("in_memory | host | ssd policies: keep each layer's aggregation in this tier (device | "
     "host | ssd) instead of regathering its input in backward ('' = regather, as GriNNder)")
    store_dtype: str = ""
    ("storage dtype of blocks offloaded to host RAM and SSD, computation staying float32: "
     "float32 | bfloat16 | float16 | int8 | int8-stochastic, or auto (the auto policy may "
     "choose bfloat16 or int8) ('' = float32, exact)")
    store_dtype_activations: str = ""
    "storage dtype of activations only ('' = store_dtype)"
    store_dtype_aggregations: str = ""
    "storage dtype of kept aggregations only ('' = store_dtype)"
    store_dtype_gradients: str = ""
    "storage dtype of gradients only ('' = store_dtype)"
    parts: int = 0
    "partitions for out-of-core runs (0 = 4 when out of core; with auto the planner chooses)"
    profile: str = ""
    "auto policy: hardware profile file ('' = the default, measured on first use)"
    partitioner: str = "label_propagation"
    ("label_propagation | contiguous | random | metis | FILE.npy (an assignment saved by "
     "`jgrind partition --out`)")
    partitioner_options: str = ""
    ("the partitioner's options, as key:value pairs joined by commas, e.g. "
     "edge_imbalance:1.5,imbalance:1.02 for label_propagation (at most that many times a fair "
     "share of the edges and of the nodes per partition) or imbalance:1.05 for metis")
    devices: int = 0
    ("devices to train on, the partitions spread over them (0 = one device; with several "
     "processes, every process's devices)")
    device_budget: str = ""
    "memory budget of each device, e.g. 2GiB ('' = unlimited)"
    host_budget: str = ""
    "host RAM budget for offloaded blocks, e.g. 4GiB ('' = unlimited)"
    store: str = ""
    "directory for the SSD tier (a private subdirectory is made and removed)"
    num_nodes: int = 20_000
    "generated datasets: number of nodes"
    avg_degree: float = 10.0
    "generated datasets: average degree"
    num_classes: int = 0
    ("the number of classes (0: the largest label + 1, refused if some id below it labels no "
     "node; state it when a class of the task has no node in the file)")
    dataset_options: str = ""
    ("more options for the dataset's loader, as key:value pairs joined by commas, e.g. "
     "to_undirected:true,split:time or node_features:edge_mean for ogb:DIR, num_features:128 "
     "or num_tasks:8 (multi-label) for csbm")

    def __post_init__(self):
        # the Python factories' names (`jgrind.plan.policies.host_offload`) name the same
        # policies: a user who read the API docs first types them
        canonical = POLICY_ALIASES.get(self.policy.replace("-", "_"), self.policy)
        object.__setattr__(self, "policy", canonical)
        for name, (valid, expected) in _LIMITS.items():
            value = getattr(self, name)
            if not valid(value):
                raise ConfigError(f"setting {name}={value!r} is out of range: {name} must be "
                                  f"{expected}")
        self.loader_options()  # a malformed list is an error now, not when the graph loads
        self.partitioner_kwargs()

    def with_absolute_paths(self) -> "RunConfig":
        """This config with its paths (a dataset's ``prefix:PATH``, ``store``, ``profile``)
        made absolute: what a run folder records, so that `jgrind predict` or a resume from
        another working directory reads the same files."""
        import os
        absolute = lambda path: os.path.abspath(os.path.expanduser(path))  # noqa: E731
        prefix, sep, rest = self.dataset.partition(":")
        changes = {}
        if sep and prefix.lower() in ("ogb", "npz", "edgelist", "npy") and rest:
            changes["dataset"] = f"{prefix}:{absolute(rest)}"
        for name in ("store", "profile"):
            if getattr(self, name):
                changes[name] = absolute(getattr(self, name))
        if self.partitioner.endswith(".npy"):  # a saved assignment
            changes["partitioner"] = absolute(self.partitioner)
        return dataclasses.replace(self, **changes)

    def loader_options(self) -> dict:
        """``dataset_options`` as keyword arguments: ``"split:time,to_undirected:true"`` ->
        ``{"split": "time", "to_undirected": True}``; numbers and true/false are converted."""
        # num_nodes and avg_degree are settings of their own, not two that could disagree
        return _key_values("dataset_options", self.dataset_options,
                           ("num_nodes", "avg_degree", "num_classes"))

    def partitioner_kwargs(self) -> dict:
        """``partitioner_options`` as keyword arguments (see `loader_options`)."""
        return _key_values("partitioner_options", self.partitioner_options, ("seed",))

    @classmethod
    def field_docs(cls) -> dict[str, str]:
        """``{name: doc}`` from the string literal after every field (shown by --help)."""
        import ast
        import inspect
        tree = ast.parse(inspect.getsource(cls))
        body = tree.body[0].body
        docs = {}
        for stmt, nxt in zip(body, body[1:]):
            if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) \
                    and isinstance(getattr(nxt, "value", None), ast.Constant):
                docs[stmt.target.id] = nxt.value.value
        return docs

    def with_overrides(self, assignments: list[str]) -> "RunConfig":
        """Apply ``key=value`` strings, converting to each field's type."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        hints = typing.get_type_hints(type(self))
        changes = {}
        for item in assignments:
            if "=" not in item:
                raise ConfigError(f"--set expects key=value, got {item!r}")
            key, value = item.split("=", 1)
            key = key.strip().replace("-", "_")
            if key not in fields:
                raise ConfigError(f"unknown setting {key!r}; known settings: "
                                  f"{', '.join(sorted(fields))}")
            changes[key] = _convert(key, value.strip(), hints[key])
        return dataclasses.replace(self, **changes)


def main_job(store: str = "") -> RunConfig:
    """What ``jgrind train`` runs when no dataset is named: a generated graph whose training
    needs about five times the memory budgets it is given, with the planner (``auto``)
    choosing partitions and a fate per tensor, the SSD tier in use, and the first seed
    trained again in memory to show the loss is the same. ``store``: the SSD tier's folder
    (the engine makes a private subfolder there and removes it); '' = the system's
    temporary folder. Each setting is a default: a flag or ``--set`` changes it."""
    import tempfile
    return RunConfig(dataset="csbm", num_nodes=MAIN_JOB_NODES, epochs=MAIN_JOB_EPOCHS,
                     policy="auto", device_budget=MAIN_JOB_BUDGETS[0],
                     host_budget=MAIN_JOB_BUDGETS[1], store=store or tempfile.gettempdir(),
                     check_in_memory=True)


# the main job's graph, length and budgets: sized so that it runs in about a minute on two
# CPU cores and still sends blocks to every tier (docs/results.md, "The first command")
MAIN_JOB_NODES = 60_000
MAIN_JOB_EPOCHS = 60
MAIN_JOB_BUDGETS = ("16MiB", "8MiB")


def _positive_number(text: str) -> bool:
    try:
        return math.isfinite(float(text)) and float(text) > 0
    except ValueError:
        return False


# every number a run takes, and what it must be: checked when a RunConfig is made, so that a bad
# value is one line before anything is loaded or written, not a traceback epochs later
_LIMITS = {
    "hidden": (lambda v: v >= 1, "at least 1"),
    "layers": (lambda v: v >= 1, "at least 1"),
    "heads": (lambda v: v >= 1, "at least 1"),
    "dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "lr": (lambda v: math.isfinite(v) and v > 0, "a finite number above 0"),
    "weight_decay": (lambda v: math.isfinite(v) and v >= 0, "a finite number, 0 or more"),
    "epochs": (lambda v: v >= 1, "at least 1"),
    "seed": (lambda v: v >= 0, "0 or more"),
    "seeds": (lambda v: v >= 1, "at least 1"),
    "split": (lambda v: v >= -1, "-1 (one per seed) or a split's number, 0 or more"),
    "patience": (lambda v: v >= 0, "0 (off) or more"),
    "select": (lambda v: v in ("val", "val_loss"), "val or val_loss"),
    "metric": (lambda v: v in ("", "accuracy", "roc_auc", "micro_f1", "macro_f1"),
               "'' (by the task), accuracy, roc_auc, micro_f1 or macro_f1"),
    "label_smoothing": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "multilabel_loss": (lambda v: v in ("node_mean", "pair_mean"), "node_mean or pair_mean"),
    "pos_weight": (lambda v: v in ("none", "auto") or _positive_number(v),
                   "none, auto or a finite number above 0"),
    "optimizer": (lambda v: v in ("adam", "adamw", "sgd"), "adam, adamw or sgd"),
    "lr_schedule": (lambda v: v in ("constant", "cosine"), "constant or cosine"),
    "warmup_epochs": (lambda v: v >= 0, "0 (off) or more"),
    "output_heads": (lambda v: v >= 1, "at least 1"),
    "num_bases": (lambda v: v >= 0, "0 (one weight per relation) or more"),
    "num_blocks": (lambda v: v >= 0, "0 (dense weights) or more"),
    "attention_dropout": (lambda v: v == -1 or 0 <= v < 1, "-1 (as dropout) or in [0, 1)"),
    "min_delta": (lambda v: math.isfinite(v) and v >= 0, "a finite number, 0 or more"),
    "eval_every": (lambda v: v >= 1, "at least 1"),
    "checkpoint_every": (lambda v: v >= 0, "0 (off) or more"),
    "parts": (lambda v: v >= 0, "0 (the default) or more"),
    "devices": (lambda v: v >= 0, "0 (one device) or more"),
    "num_nodes": (lambda v: v >= 1, "at least 1"),
    "avg_degree": (lambda v: math.isfinite(v) and v >= 0, "a finite number, 0 or more"),
    "num_classes": (lambda v: v >= 0, "0 (from the labels) or more"),
}


def _key_values(setting: str, text: str, own_settings: tuple[str, ...]) -> dict:
    """``"a:1,b:true"`` -> ``{"a": 1, "b": True}`` for the setting named ``setting``; keys in
    ``own_settings`` are settings of their own and refused here."""
    options = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition(":")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise ConfigError(f"setting {setting}={text!r}: expected key:value pairs joined by "
                              f"commas, found {item!r}")
        if key in own_settings:
            raise ConfigError(f"setting {setting}={text!r}: {key} is a setting of its own; "
                              f"pass --set {key}=... instead")
        options[key] = _option_value(value.strip())
    return options


def _option_value(text: str) -> object:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _convert(key: str, value: str, kind) -> object:
    try:
        if kind is bool:
            lowered = value.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError
        return kind(value)
    except ValueError:
        raise ConfigError(f"setting {key}={value!r} is not a valid {kind.__name__}") from None


ACTIVATIONS = {"relu": jax.nn.relu, "elu": jax.nn.elu, "gelu": jax.nn.gelu, "tanh": jnp.tanh}


def build_model(cfg: RunConfig, graph: Graph) -> GNN:
    acts = ACTIVATIONS
    if cfg.activation not in acts:
        raise ConfigError(f"unknown activation {cfg.activation!r}; use one of {sorted(acts)}")
    common = dict(num_layers=cfg.layers, dropout=cfg.dropout, residual=cfg.residual,
                  layer_norm=cfg.layer_norm, activation=acts[cfg.activation])
    f, c = graph.num_features, graph.num_classes
    if cfg.model == "gcn":
        return gcn(f, cfg.hidden, c, **common)
    if cfg.model == "sage":
        return sage(f, cfg.hidden, c, **common)
    if cfg.model == "gat":
        return gat(f, cfg.hidden, c, heads=cfg.heads, output_heads=cfg.output_heads,
                   attention_dropout=None if cfg.attention_dropout < 0 else
                   cfg.attention_dropout, **common)
    if cfg.model == "rgcn":
        try:
            return rgcn(f, cfg.hidden, c, graph.num_relations, num_bases=cfg.num_bases or None,
                        num_blocks=cfg.num_blocks or None, **common)
        except ValueError as e:
            raise ConfigError(f"rgcn: {e}") from e
    if cfg.model == "rgat":
        return rgat(f, cfg.hidden, c, graph.num_relations, heads=cfg.heads,
                    output_heads=cfg.output_heads, attention_dropout=None
                    if cfg.attention_dropout < 0 else cfg.attention_dropout, **common)
    raise ConfigError(f"unknown model {cfg.model!r}; use gcn, sage, gat, rgcn or rgat")


def build_loss(cfg: RunConfig, graph: Graph, split: int = 0):
    """The per-node training loss (`jgrind.loss.weighted_loss`) for training on ``split``;
    None: the task's default (cross entropy, or binary cross entropy for multi-label targets,
    averaged node by node)."""
    from jgrind.loss import (SmoothedCrossEntropy, WeightedBinaryCrossEntropy,
                             pair_mean_binary_cross_entropy, positive_weights)
    if cfg.label_smoothing and graph.multilabel:
        raise ConfigError(f"label_smoothing smooths one class per node, but {graph.name} has "
                          "multi-label targets; leave label_smoothing at 0")
    pos_weight = None
    if cfg.pos_weight != "none":
        if not graph.multilabel:
            raise ConfigError(f"pos_weight weights binary targets, but {graph.name} has one "
                              "class per node; leave it at none")
        pos_weight = (positive_weights(graph, split) if cfg.pos_weight == "auto"
                      else (float(cfg.pos_weight),) * graph.num_classes)
    if cfg.multilabel_loss == "pair_mean":
        if not graph.multilabel:
            raise ConfigError(f"multilabel_loss=pair_mean averages binary targets, but "
                              f"{graph.name} has one class per node; leave it at node_mean")
        return pair_mean_binary_cross_entropy(graph, split, pos_weight)
    if pos_weight is not None:
        return WeightedBinaryCrossEntropy(pos_weight)
    return SmoothedCrossEntropy(cfg.label_smoothing) if cfg.label_smoothing else None


def build_optimizer(cfg: RunConfig) -> optax.GradientTransformation:
    """The configured optimizer, one step per epoch. Adam (the default) and SGD add the L2
    penalty to the gradient, the way PyTorch's ``Adam(weight_decay=...)`` (and the GCN/GAT
    reference code) regularise; AdamW decays the weights apart from the gradient. With a
    schedule (or warm-up) the learning rate is injected, so the log records it per epoch."""
    if cfg.warmup_epochs >= cfg.epochs and cfg.warmup_epochs:
        raise ConfigError(f"warmup_epochs={cfg.warmup_epochs} leaves none of the "
                          f"{cfg.epochs} epochs after the warm-up; use fewer")
    start = cfg.lr / (cfg.warmup_epochs + 1)  # the warm-up's first epoch already moves
    if cfg.lr_schedule == "constant" and not cfg.warmup_epochs:
        rate = cfg.lr
    elif cfg.lr_schedule == "cosine":
        rate = optax.warmup_cosine_decay_schedule(start if cfg.warmup_epochs else cfg.lr,
                                                  cfg.lr, cfg.warmup_epochs, cfg.epochs)
    else:  # constant after a warm-up
        rate = optax.join_schedules([optax.linear_schedule(start, cfg.lr, cfg.warmup_epochs),
                                     optax.constant_schedule(cfg.lr)], [cfg.warmup_epochs])

    def make(learning_rate):
        if cfg.optimizer == "adamw":
            return optax.adamw(learning_rate, weight_decay=cfg.weight_decay)
        inner = optax.adam(learning_rate) if cfg.optimizer == "adam" else \
            optax.sgd(learning_rate, momentum=0.9)
        return optax.chain(optax.add_decayed_weights(cfg.weight_decay), inner)
    return make(rate) if isinstance(rate, float) else optax.inject_hyperparams(make)(
        learning_rate=rate)


def load_graph(cfg: RunConfig, **loader_options) -> Graph:
    """The graph ``cfg`` names; ``loader_options`` go to its loader beside the settings'."""
    from jgrind.devices.local import local_graph
    local = None if loader_options else local_graph(cfg)
    if local is not None:  # one of several processes, reading only its own rows
        return local
    if cfg.num_classes:
        loader_options = {"num_classes": cfg.num_classes, **loader_options}
    from jgrind import datasets
    from jgrind.datasets.errors import DatasetError
    from jgrind.datasets.features import row_normalize_features
    from jgrind.datasets.generated import GENERATED
    if cfg.dataset in GENERATED:
        try:
            graph = datasets.load(cfg.dataset, **{"num_nodes": cfg.num_nodes,
                                                  "avg_degree": cfg.avg_degree,
                                                  **cfg.loader_options(), **loader_options})
        except DatasetError:
            raise
        except ValueError as err:  # the generator's own check of its arguments
            raise ConfigError(f"cannot generate {cfg.dataset} with num_nodes={cfg.num_nodes}, "
                              f"avg_degree={cfg.avg_degree}"
                              + (f", {cfg.dataset_options}" if cfg.dataset_options else "")
                              + f": {err}") from None
    else:
        options = {**cfg.loader_options(), **loader_options}
        if datasets.split_per_seed(cfg.dataset, options):  # seed s: the split drawn from s
            options = {"seed": cfg.seed, "splits": cfg.seeds, **options}
        graph = datasets.load(cfg.dataset, **options)
    return row_normalize_features(graph) if cfg.row_normalize else graph


# ("bytes": as `jgrind.plan.cost.format_bytes` writes a size under 1 KiB, so that a stated
# minimum can be passed back as written)
_UNITS = {"": 1, "b": 1, "byte": 1, "bytes": 1, "k": 2**10, "kb": 10**3, "kib": 2**10,
          "m": 2**20, "mb": 10**6, "mib": 2**20, "g": 2**30, "gb": 10**9, "gib": 2**30,
          "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_bytes(text: str) -> Optional[int]:
    """``"2GiB"`` -> 2147483648; ``""`` -> None (unlimited)."""
    text = text.strip()
    if not text:
        return None
    number = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ")
    unit = text[len(number):].strip().lower()
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not 0 <= value * _UNITS[unit] < 2**63:
        raise ConfigError(f"cannot read {text!r} as a size; write e.g. 512MiB, 2GiB or 10GB")
    return int(value * _UNITS[unit])


def build_policy(cfg: RunConfig, on_plan=None):
    """The offload policy and engine arguments the configuration asks for (all None: in memory;
    ``devices`` only when the configuration sets it).
    ``on_plan``: for the auto policy, called with the run's `Plan` once it is made."""
    from jgrind.plan import policies
    device, host = parse_bytes(cfg.device_budget), parse_bytes(cfg.host_budget)
    store = cfg.store or None
    keep = _aggregation_fate(cfg)
    choices = {
        "": lambda: None,
        "in_memory": lambda: policies.in_memory(keep),
        "host": lambda: policies.host_offload(keep),
        "ssd": lambda: policies.ssd_offload(_need_store(store), aggregations=keep),
        "recompute": policies.recompute_activations,
        "grinnder": lambda: policies.grinnder(device or UNLIMITED, host or UNLIMITED, store),
        "auto": lambda: policies.auto(directory=store, profile=cfg.profile or None,
                                      on_plan=on_plan),
    }
    if cfg.policy not in choices:
        raise ConfigError(f"unknown policy {cfg.policy!r}; use one of "
                          f"{', '.join(k for k in choices if k)}")
    try:  # the storage dtypes of offloaded blocks (`policies.with_storage`)
        policy = policies.with_storage_named(
            choices[cfg.policy](), cfg.store_dtype, cfg.store_dtype_activations,
            cfg.store_dtype_aggregations, cfg.store_dtype_gradients)
    except ValueError as e:
        raise ConfigError(f"setting store_dtype: {e}") from None
    engine = {"policy": policy, "num_parts": cfg.parts or None, "store": store,
              "device_budget": device, "host_budget": host,
              "partitioner": build_partitioner(cfg)}
    if cfg.devices:  # `jgrind.train`'s devices; left out for one device, as before it existed
        out_of_core = [f"{name}={value}" for name, value in (
            ("policy", cfg.policy if cfg.policy != "in_memory" else ""), ("store", cfg.store),
            ("device_budget", cfg.device_budget), ("host_budget", cfg.host_budget)) if value]
        if out_of_core:  # host and SSD tiers, the steps spread over the devices
            return {**engine, "devices": cfg.devices}
        return {"num_parts": cfg.parts or None, "partitioner": engine["partitioner"],
                "devices": cfg.devices}
    return engine


def build_partitioner(cfg: RunConfig):
    """The partitioner function the configuration names, with its ``partitioner_options``
    bound (each checked against the function's keyword arguments)."""
    import functools
    import inspect

    from jgrind.partition import PARTITIONERS
    if cfg.partitioner.endswith(".npy"):  # a saved assignment (`jgrind partition --out`)
        from jgrind.datasets.saved_arrays import saved_assignment
        return saved_assignment(cfg.partitioner)
    if cfg.partitioner not in PARTITIONERS:
        raise ConfigError(f"unknown partitioner {cfg.partitioner!r}; use one of "
                          f"{', '.join(PARTITIONERS)}")
    fn = PARTITIONERS[cfg.partitioner]
    options = cfg.partitioner_kwargs()
    if not options:
        return fn
    known = [name for name, p in inspect.signature(fn).parameters.items()
             if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "seed"]
    unknown = sorted(set(options) - set(known))
    setting = f"setting partitioner_options={cfg.partitioner_options!r}"
    if unknown:
        raise ConfigError(f"{setting}: {cfg.partitioner} has no option {', '.join(unknown)}; "
                          f"its options: {', '.join(known) or 'none'}")
    bound = functools.wraps(fn)(functools.partial(fn, **options))
    try:  # the values checked now, before any graph is loaded: one node, one part, no work
        bound(_one_node_graph(), 1, seed=cfg.seed)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{setting}: {e}") from None
    return bound


def _one_node_graph() -> Graph:
    import numpy as np

    from jgrind.graph import from_edges
    none = np.zeros(0, np.int64)
    return from_edges(none, none, np.zeros((1, 1), np.float32), np.zeros(1, np.int32))


def _aggregation_fate(cfg: RunConfig):
    from jgrind.plan import Fate
    tiers = {"": Fate.RECOMPUTE, "device": Fate.DEVICE, "host": Fate.HOST, "ssd": Fate.SSD}
    if cfg.keep_aggregations not in tiers:
        raise ConfigError(f"unknown tier {cfg.keep_aggregations!r} for keep_aggregations; use "
                          "device, host or ssd (or leave it out to regather)")
    if cfg.keep_aggregations and cfg.policy not in ("in_memory", "host", "ssd"):
        raise ConfigError(f"keep_aggregations applies to the in_memory, host and ssd policies, "
                          f"not to {cfg.policy or 'the in-memory path'!r}")
    return tiers[cfg.keep_aggregations]


def _need_store(store):
    if store is None:
        raise ConfigError("the ssd policy needs a store directory: add --store /path/to/disk")
    return store


def split_for(cfg: RunConfig, graph: Graph, trial: int) -> int:
    if cfg.split >= 0:
        if cfg.split >= graph.num_splits:
            raise ConfigError(f"setting split={cfg.split}: {graph.name} has {graph.num_splits} "
                              f"split(s), numbered 0..{graph.num_splits - 1} (or -1: one per "
                              "seed)")
        return cfg.split
    return trial % graph.num_splits if graph.num_splits > 1 else 0

