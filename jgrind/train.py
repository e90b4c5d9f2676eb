"""The functional trainer: ``train(key, graph, model, optimizer, epochs=...) -> TrainResult``.

One straight line: prepare -> (resume) -> for each epoch: step, evaluate, log, checkpoint.
The *executor* does the numerical work of an epoch. `InMemory` (here) runs the whole model in one
jitted step, the fast path when everything fits; the out-of-core engine and
`jgrind.devices.Sharded` (one model over several devices) provide the same methods (`step`,
`predict`, `embed`), so the trainer, logging, checkpoints, trials and predictions are shared by
every execution strategy. Made without an optimizer, either only
predicts.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import time
import warnings
from typing import Any, Callable, Optional, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jgrind import checkpoint as ckpt, interrupts
from jgrind.arguments import whole_number
from jgrind.devices import Sharded
from jgrind.engine import OutOfCore
from jgrind.graph import Graph
from jgrind.loss import node_weights, weighted_loss
from jgrind.metrics import check_metric, cross_entropy, default_metric, evaluate
from jgrind.models.model import GNN, Params
from jgrind.plan.budgets import check_budget
from jgrind.plan.check import check_epoch
from jgrind.plan.execution import Execution, choose_execution
from jgrind.plan.execution import in_memory_bytes  # noqa: F401 - jgrind.train's public name
from jgrind.plan.protocols import check_policy
from jgrind.plan.replan import Replanner


class Executor(Protocol):
    """How an epoch is computed. ``step`` does forward, backward and the optimizer update."""

    def step(self, params: Params, opt_state: Any, key: jax.Array) -> tuple[Params, Any, float]:
        ...

    def predict(self, params: Params) -> np.ndarray:
        """Logits ``[N, C]`` on the host, dropout off."""
        ...

    def embed(self, params: Params, layer: int) -> np.ndarray:
        """``[N, width]`` on the host, dropout off: the output of the model's first ``layer``
        layers (0: the features; all of them: the logits), in the graph's node order."""
        ...


NO_OPTIMIZER = ("this executor was made without an optimizer, for predictions only; pass "
                "one (e.g. optax.adam(0.01)) to train with it")


class InMemory:
    """The whole graph on one device, one jitted step for the whole model: no per-layer Python.

    Built once per (graph, model, optimizer); arrays are moved to the device explicitly here.
    """

    def __init__(self, graph: Graph, model: GNN,
                 optimizer: Optional[optax.GradientTransformation] = None, split: int = 0,
                 device=None, loss: Optional[Callable] = None):
        normalized = model.normalize(graph)
        put = lambda a: jax.device_put(a, device)  # noqa: E731 - the one explicit transfer
        self.block = put(model.block(normalized))
        self.x = put(graph.features)
        self.labels = put(graph.labels)
        self.weights = put(node_weights(graph.train_mask[split]))
        self.model, self.optimizer = model, optimizer
        node_loss = loss  # (`step` below names its result `loss`)

        def loss_fn(params, block, x, labels, weights, key):
            logits = model.apply(params, block, x, key)
            return weighted_loss(node_loss, logits, labels, weights)

        def step(params, opt_state, block, x, labels, weights, key):
            loss, grads = jax.value_and_grad(loss_fn)(params, block, x, labels, weights, key)
            # value=: the epoch's loss, for transformations that take it (reduce_on_plateau)
            updates, opt_state = optax.with_extra_args_support(optimizer).update(
                grads, opt_state, params, value=loss)
            return optax.apply_updates(params, updates), opt_state, loss

        # params and optimizer state are donated: the old buffers are dead after the update.
        self._step = jax.jit(step, donate_argnums=(0, 1))
        self._predict = jax.jit(lambda p, b, x: model.apply(p, b, x, None))
        self._embed = jax.jit(lambda p, b, x, n: model.apply(p, b, x, None, n),
                              static_argnums=3)
        self._loss_and_grad = jax.jit(jax.value_and_grad(loss_fn))

    def step(self, params, opt_state, key):
        if self.optimizer is None:
            raise ValueError(NO_OPTIMIZER)
        params, opt_state, loss = self._step(params, opt_state, self.block, self.x, self.labels,
                                             self.weights, key)
        return params, opt_state, loss

    def predict(self, params) -> np.ndarray:
        return np.asarray(self._predict(params, self.block, self.x))

    def embed(self, params, layer: int) -> np.ndarray:
        return np.asarray(self._embed(params, self.block, self.x, self.model.check_layer(layer)))

    def loss_and_grad(self, params, key):
        """Loss and gradient without an update: the reference the engine is tested against."""
        return self._loss_and_grad(params, self.block, self.x, self.labels, self.weights, key)


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a run returns.

    Attributes:
      params: parameters after the last epoch.
      best_params: parameters at ``best_epoch`` (by default the highest validation metric;
        see `train`'s ``select``).
      history: one dict per epoch (see `train`), also written to the metrics log.
      metric: "accuracy", "roc_auc", "micro_f1" or "macro_f1".
      best_epoch, val, test: model selection by validation: the validation and test metric at
        the best epoch.
      seconds: wall time of the epochs, those before a resume included (not counting
        preparation).
      memory: out-of-core runs only: the store's accounts (bytes per tier now and at peak,
        bytes moved) and its ``timeline`` of ``(seconds, device, host, ssd)``, of the epochs
        this call ran (from ``first_epoch``); else None.
      first_epoch: the first epoch this call ran: 0, or the epoch after a resumed checkpoint.
      devices: runs over several devices only: ``placement`` (one line per device: its
        partitions, predicted seconds and bytes), ``moved`` and ``minimum`` (bytes the halo
        exchange moves between devices per epoch, and the least any exchange could); out of
        core over several processes ``between_processes`` (``sent``: the bytes of halo rows
        this process sent the others in the last epoch, beside their ``minimum``); out of
        core also ``device_peaks`` (each device's device-tier blocks at their peak,
        measured) beside ``predicted_device_peaks`` (the plan's), ``device_working_sets``
        (the plan's, per device) and ``device_budget`` (per device); else None.
      plan: where ``auto`` planned the run out of core and could re-plan it (its
        ``replan``), the `jgrind.plan.planner.Plan` the run ended with: its first plan, or
        the last it re-planned to; else None (``on_plan`` sees the first plan in any case).
    """

    params: Params
    best_params: Params
    history: list
    metric: str
    best_epoch: int
    val: float
    test: float
    seconds: float
    memory: Optional[dict] = None
    first_epoch: int = 0
    devices: Optional[dict] = None
    plan: Optional[object] = None


def _check_train_arguments(key, graph, model, optimizer, *, epochs, eval_every, patience,
                           checkpoint_every, select, min_delta, loss, metrics) -> None:
    """ValueError or TypeError naming a bad argument of `train`, before any work."""
    if not isinstance(graph, Graph):
        raise TypeError(f"graph must be a jgrind.Graph (e.g. jgrind.datasets.load(...)), got "
                        f"{type(graph).__name__}")
    if not isinstance(model, GNN):
        raise TypeError(f"model must be a jgrind GNN (e.g. jgrind.models.gcn(...)), got "
                        f"{type(model).__name__}")
    if not (isinstance(optimizer, optax.GradientTransformation)
            or (hasattr(optimizer, "init") and hasattr(optimizer, "update"))):
        raise TypeError(f"optimizer must be an optax transformation, e.g. optax.adam(0.01), got "
                        f"{optimizer!r}")
    if not (isinstance(key, jax.Array) and jax.dtypes.issubdtype(key.dtype,
                                                                   jax.dtypes.prng_key)) \
            and not (isinstance(key, jax.Array) and key.dtype == jnp.uint32
                     and key.shape == (2,)):
        raise TypeError(f"key must be a JAX random key, e.g. jax.random.key(0), got {key!r}")
    whole_number(epochs, "epochs")
    whole_number(eval_every, "eval_every")
    whole_number(checkpoint_every, "checkpoint_every")
    if patience is not None:
        whole_number(patience, "patience (None: no early stopping)")
    if select not in SELECTION:
        raise ValueError(f"unknown select {select!r}; use one of {', '.join(SELECTION)}")
    if not (isinstance(min_delta, (int, float)) and math.isfinite(min_delta)
            and min_delta >= 0):
        raise ValueError(f"min_delta must be a finite number, 0 or more; got {min_delta!r}")
    if loss is not None and not callable(loss):
        raise TypeError(f"loss must be a per-node loss function (logits, labels) -> [n], got "
                        f"{loss!r}")
    for name, fn in metrics.items():
        if not (isinstance(name, str) and name.isidentifier() and callable(fn)):
            raise TypeError(f"metrics must map names to functions (logits, labels, mask) -> "
                            f"float; got {name!r}: {fn!r}")


def train(key: jax.Array, graph: Graph, model: GNN, optimizer: optax.GradientTransformation, *,
          epochs: int, split: int = 0, metric: Optional[str] = None, eval_every: int = 1,
          patience: Optional[int] = None, select: str = "val", min_delta: float = 0.0,
          log_path: Optional[str | pathlib.Path] = None,
          checkpoint_dir: Optional[str | pathlib.Path] = None, checkpoint_every: int = 10,
          progress: bool = True, executor: Optional[Executor] = None,
          policy=None, num_parts: Optional[int] = None, store=None,
          device_budget: Optional[int] = None, host_budget: Optional[int] = None,
          partitioner=None, loss: Optional[Callable] = None,
          metrics: Optional[dict] = None,
          ready: Optional[Callable[[], None]] = None, devices=None) -> TrainResult:
    """Train ``model`` on the full graph for ``epochs`` epochs (one optimizer step each).

    Args:
      key: the run's only source of randomness: split once into init and dropout keys; the
        dropout key of epoch ``e`` is ``fold_in(dropout_key, e)``.
      graph: the raw graph; the model's normalisation is applied here, on the whole graph.
      model, optimizer: a `GNN` and any optax transformation.
      split: which row of the graph's masks to use.
      metric: "accuracy", "roc_auc", "micro_f1" or "macro_f1" (`jgrind.metrics.METRICS`);
        default by the task: ROC-AUC for binary and multi-label tasks, else accuracy. A
        resumed checkpoint must have been scored by the same metric.
      eval_every: evaluate on val/test every this many epochs (and at the last).
      patience: stop when the selection score has not improved for this many evaluations.
      select: what picks the best epoch (``best_params``, ``val``, ``test``) and what
        ``patience`` watches: "val" (the highest validation metric) or "val_loss" (the lowest
        validation loss).
      min_delta: an evaluation improves on the best only by more than this.
      log_path: write one JSON object per epoch (JSON lines).
      checkpoint_dir, checkpoint_every: orbax checkpoints; an existing checkpoint is resumed
        (its newest intact step: a damaged one is set aside with a warning,
        `jgrind.checkpoint.restore_latest`; `jgrind.checkpoint.CheckpointError` if none is).
      executor: how to compute an epoch; default: chosen by `make_executor` from the
        out-of-core arguments below (`InMemory` when none is given).
      policy, num_parts, store, device_budget, host_budget, partitioner: run out of core, see
        `make_executor` and `jgrind.engine.OutOfCore`.
      loss: the per-node training loss, ``(logits [n, C], labels [n]) -> [n]`` in JAX
        (`jgrind.loss.weighted_loss`; default `jgrind.loss.cross_entropy`); also what
        ``val_loss`` reports. Multi-label targets reach it as ``[n, T]`` int8 with -1 for an
        unknown target, which it must leave out (default
        `jgrind.loss.binary_cross_entropy`). Checked on shapes before training.
      metrics: more metrics to log, ``{name: fn(logits, labels, mask) -> float}`` on host
        arrays (e.g. `jgrind.metrics.macro_f1`): each evaluation records ``train_NAME``,
        ``val_NAME`` and ``test_NAME``.
      devices: run data-parallel over several devices (`jgrind.devices.Sharded`): a number K
        (the first K of ``jax.devices()``) or a sequence of ``jax.Device``; None: one device.
        ``num_parts`` partitions (default: one per device) are placed on them. With out-of-core
        arguments (``policy``, ``store``, budgets), the out-of-core engine runs each
        partition's steps on its device, its tensors in this process's tiers, device blocks
        on their partition's device (`jgrind.devices.ShardedOutOfCore`; default policy
        `host_offload` with the aggregations kept on the host,
        `jgrind.devices.out_of_core.through_host_policy`; the device budget is per device).
        With a device budget alone, in memory on the devices while it holds their programs,
        else the planner's fates and per-layer routes (`jgrind.devices.choose`).
      ready: called once everything is set up and checked (the executor with its budgets and
        store, a resumed checkpoint), before the log is opened and the first epoch runs; what
        fails before it is a bad argument, and nothing has been written. (`jgrind train`
        writes its run folder then.)

    Each history record: ``epoch, loss, seconds``; ``lr`` when the optimizer exposes its
    learning rate (`learning_rate`); and, on evaluated epochs, ``train``, ``val``, ``test``
    (the metric), ``val_loss`` and any ``metrics``. A planned run's epochs are held against
    the plan (`jgrind.plan.check.EpochCheck.as_record`), and one that re-plans
    (`jgrind.plan.replan`: `auto`, between epochs) records its review (``plan_review``) and
    the re-plan (``replan``) on the epoch that led to it; ``plan`` counts the re-plans before
    an epoch, from the first.
    """
    metrics = dict(metrics or {})
    _check_train_arguments(key, graph, model, optimizer, epochs=epochs, eval_every=eval_every,
                           patience=patience, checkpoint_every=checkpoint_every, select=select,
                           min_delta=min_delta, loss=loss, metrics=metrics)
    score_of = SELECTION[select]
    val_loss = _host_loss(loss)
    graph.check_split(split)
    model.check_fits(graph)
    metric = metric or default_metric(graph.num_classes, graph.multilabel, graph.name)
    check_metric(metric, graph.num_classes, graph.multilabel)
    if loss is not None:
        _check_loss(loss, graph, model)
    masks = (graph.train_mask[split], graph.val_mask[split], graph.test_mask[split])
    labels = graph.labels
    owned_executor = executor is None
    node_loss = loss  # (the epochs' loop names the epoch's loss value `loss`)

    init_key, dropout_key = jax.random.split(key)
    # op by op: a jitted `initial_state` would compile once per model and optimizer (about
    # 1 s on CPU-2), where the ops' own programs are shared by every model (5 ms warm)
    params = model.init(init_key)
    opt_state = optimizer.init(params)
    best = {"epoch": -1, "val": -math.inf, "test": float("nan"), "score": -math.inf,
            "params": params}
    history: list[dict] = []
    start_epoch = 0

    log_file = manager = replanner = None
    stale = 0
    train_seconds = 0.0
    warned_nan = False
    try:
        # Within the try, so that the store's files are removed below whatever fails next.
        # Made before anything is written: a budget or store directory it rejects is an error
        # that leaves no checkpoint folder or log behind.
        if owned_executor:
            executor, replanner = _make_executor(
                graph, model, optimizer, split=split, policy=policy, num_parts=num_parts,
                store=store, device_budget=device_budget, host_budget=host_budget,
                partitioner=partitioner, loss=loss, devices=devices)

        # -- resume --------------------------------------------------------------------------
        manager = ckpt.manager(checkpoint_dir, checkpoint_every) if checkpoint_dir else None
        if manager is not None:
            like = {"params": params, "opt_state": opt_state, "best_params": params}
            fingerprint = graph.fingerprint()
            restored = ckpt.restore_latest(manager, like, graph=fingerprint)
            if restored is not None:
                saved_epoch, state, meta = restored
                params, opt_state = state["params"], state["opt_state"]
                history = meta["history"]
                # older checkpoints: selected by the metric, which they did not record
                for name, value in (("select", select), ("metric", metric)):
                    saved = meta.get(name, value if name == "metric" else "val")
                    if saved != value:
                        raise ckpt.CheckpointMismatch(
                            f"the checkpoint in {checkpoint_dir} was trained with "
                            f"{name}={saved!r} (its log and best epoch are scored so); "
                            f"resume it with that, or use a new checkpoint directory")
                best = {**meta["best"], "params": state["best_params"], "score": -math.inf}
                evaluated = [r for r in history if "val" in r]
                if best["epoch"] >= 0:  # the score from the log (older checkpoints saved none)
                    best["score"] = score_of(history[best["epoch"]])
                train_seconds = sum(record["seconds"] for record in history)
                # older checkpoints saved no count: the evaluations since the best
                stale = meta.get("stale", sum(r["epoch"] > best["epoch"] for r in evaluated))
                start_epoch = saved_epoch + 1
                if start_epoch > epochs:
                    raise ckpt.CheckpointMismatch(
                        f"the checkpoint in {checkpoint_dir} is of epoch {saved_epoch}, past "
                        f"this run's {epochs} epochs; train for at least {start_epoch} epochs "
                        "to resume it, or use a new checkpoint directory")

        # -- epochs --------------------------------------------------------------------------
        if ready is not None:
            ready()
        if log_path is not None:
            log_path = pathlib.Path(log_path)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = open(log_path, "w")
            for record in history:
                log_file.write(json.dumps(record) + "\n")
        resumed_at = start_epoch
        compiled_at = resumed_at  # the epoch that compiles: the first, and after a re-plan
        if patience is not None and stale >= patience:
            start_epoch = epochs  # the resumed run had stopped early: as it did, so it stays
        bar = _progress(range(start_epoch, epochs), progress, total=epochs,
                        initial=start_epoch, desc=f"{model.name} on {graph.name}")
        for epoch in bar:
            interrupts.check()
            t0 = time.perf_counter()
            params, opt_state, loss = executor.step(params, opt_state,
                                                    jax.random.fold_in(dropout_key, epoch))
            loss = float(loss)  # blocks until the step is done, so `seconds` is honest
            record = {"epoch": epoch, "loss": loss, "seconds": time.perf_counter() - t0}
            rate = learning_rate(opt_state)
            if rate is not None:
                record["lr"] = rate
            prediction = getattr(executor, "prediction", None)
            check = replanned = None
            if prediction is not None and epoch > compiled_at:
                parts = getattr(getattr(executor, "runner", None), "sweep_parts", ())
                try:
                    check = check_epoch(prediction, executor.sweep_seconds, record["seconds"],
                                        epoch, parts)
                except ValueError as err:  # a diagnostic: training goes on, unchecked
                    _say(f"jgrind: the run is not held against its plan: {err}", bar)
                    executor.prediction = None
            if check is not None:
                record.update(check.as_record())
                if replanner is not None and replanner.replans:
                    record["plan"] = replanner.replans
                # the first epoch that misses is said at once; the run's share of them at its
                # end (`jgrind.plan.check.run_check`), not one line per epoch
                if check.off() and not any(r.get("plan_off") for r in history):
                    record["plan_off"] = True
                    _say(f"jgrind: {check.line()}", bar)
                elif check.off():
                    record["plan_off"] = True
                # (`jgrind.plan.replan`'s rule: the median of the plan's first checked epochs,
                # or of those before the last, which no new plan would be used for)
                if replanner is not None and replanner.due and epoch < epochs - 1:
                    replanner.observe(check, parts)
                if replanner is not None and replanner.due and replanner.seen and (
                        replanner.ready or epoch >= epochs - 2):
                    replanner.ssd_free = _ssd_free(replanner.plan.directory, executor)
                    review = replanner.review()
                    record["plan_review"] = review.record
                    if review.plan is not None:
                        record["replan"] = review.record
                        replanned = review.plan
                        _say(f"jgrind: {review.line}", bar)
                    elif review.repriced is not None:
                        # the plan stays: later epochs are held against it re-priced with
                        # the reviewed epochs' measurements (the run's own profile from now on)
                        executor.prediction = review.repriced
            train_seconds += record["seconds"]
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss became {loss} at epoch {epoch}; lower the "
                                         "learning rate or check the features' scale")
            last = epoch == epochs - 1
            if (epoch + 1) % eval_every == 0 or last:
                logits = executor.predict(params)
                record.update({name: evaluate(logits, labels, m, metric)
                               for name, m in zip(("train", "val", "test"), masks)})
                record["val_loss"] = val_loss(logits, labels, masks[1])
                for name, fn in metrics.items():
                    record.update({f"{part}_{name}": float(fn(logits, labels, m))
                                   for part, m in zip(("train", "val", "test"), masks)})
                score = score_of(record)
                if math.isnan(score) and not warned_nan:
                    warned_nan = True
                    what = "the validation loss" if select == "val_loss" else \
                        f"the validation {metric}"
                    why = "" if select == "val_loss" else \
                        (", or every validation node has one class (every task one class "
                         "among them)")
                    warnings.warn(f"the selection score, {what} (split {split}), is undefined "
                                  f"(NaN) at epoch {epoch}, so it cannot choose the best "
                                  f"epoch: the validation mask is empty{why}; use another "
                                  "split, metric or select", stacklevel=2)
                if score > best["score"] + min_delta or best["epoch"] < 0:
                    best = {"epoch": epoch, "val": record["val"], "test": record["test"],
                            "score": score, "params": jax.tree.map(jnp.copy, params)}
                    stale = 0
                else:
                    stale += 1
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(loss=f"{loss:.4f}", val=f"{record['val']:.4f}")
            history.append(record)
            if log_file is not None:
                log_file.write(json.dumps(record) + "\n")
                log_file.flush()
            stop = patience is not None and stale >= patience
            if manager is not None:
                meta = {"best": {k: v for k, v in best.items() if k != "params"},
                        "history": history, "stale": stale, "select": select,
                        "metric": metric, "graph": fingerprint}
                state = {"params": params, "opt_state": opt_state,
                         "best_params": best["params"]}
                ckpt.save(manager, epoch, state, meta, force=last or stop)
            if stop:
                break
            if replanned is not None:  # between epochs: the same numbers, stored elsewhere
                executor.close()  # its store's files go first: the budgets hold one store
                executor = None
                executor = _engine(graph, model, optimizer, Execution(
                    in_memory=False, policy=replanned.policy(), num_parts=replanned.num_parts,
                    partitioned=replanned.partitioned, prediction=replanned.prediction,
                    plan=replanned), split=split, store=store, device_budget=device_budget,
                    host_budget=host_budget, partitioner=partitioner, loss=node_loss)
                compiled_at = epoch + 1
    finally:
        # whole, even if a second Ctrl-C or SIGTERM follows the one that stopped the run
        with interrupts.deferred():
            store = getattr(executor, "store", None)
            memory = None if store is None else {**store.accounts.as_dict(),
                                                 "timeline": list(store.accounts.timeline)}
            devices = None if not hasattr(executor, "exchange_minimum_per_epoch") else {
                "placement": executor.placement.format(),
                "moved": executor.exchange_bytes_per_epoch,
                "minimum": executor.exchange_minimum_per_epoch,
                "by_route": getattr(executor, "exchange_bytes_by_route", None),
                "between_processes": None if getattr(executor, "row_exchange", None) is None
                else {"sent": executor.process_exchange_bytes_per_epoch,
                      "minimum": executor.process_exchange_minimum_per_epoch},
                **_device_peaks(executor), **_host_share(executor, memory)}
            try:
                if owned_executor and executor is not None and hasattr(executor, "close"):
                    executor.close()  # removes the run's SSD files, also on error
            finally:
                if manager is not None:
                    manager.close()  # saves are synchronous (`ckpt.save`): none is pending
                if log_file is not None:
                    log_file.close()

    return TrainResult(params=params, best_params=best["params"], history=history,
                       metric=metric, best_epoch=int(best["epoch"]), val=float(best["val"]),
                       test=float(best["test"]), seconds=train_seconds, memory=memory,
                       first_epoch=resumed_at, devices=devices,
                       plan=None if replanner is None else replanner.plan)


def _device_peaks(executor) -> dict:
    """Each device's device-tier peak, measured and predicted, of an out-of-core run over
    several devices (`jgrind.devices.ShardedOutOfCore`); {} for any other."""
    tiers = getattr(executor, "device_tiers", None)
    if tiers is None or getattr(executor, "predicted_device_peaks", None) is None:
        return {}
    return {"device_peaks": [int(b) for b in tiers.peak],
            "predicted_device_peaks": [int(b) for b in executor.predicted_device_peaks],
            "device_working_sets": [int(b) for b in executor.device_working_sets],
            "device_budget": int(executor.engine.built.device_budget)}


def _host_share(executor, memory: Optional[dict]) -> dict:
    """This process's share of the host budget in an out-of-core run over several processes
    (`jgrind.devices.ShardedOutOfCore.predicted_host_shares`: its own host blocks and the halo
    rows it keeps of the others'), predicted and measured (its store's host peak), beside the
    budget per process; {} for any other run."""
    shares = getattr(executor, "predicted_host_shares", None)
    if shares is None:
        return {}
    me = jax.process_index()
    return {"host_share": {"process": me, "predicted": int(shares[me]),
                           "measured": int((memory or {}).get("peak_host", 0)),
                           "budget": int(executor.engine.built.host_budget)}}


# model selection: a score per evaluated epoch, higher is better
SELECTION = {"val": lambda record: record["val"],
             "val_loss": lambda record: -record["val_loss"]}


def initial_state(key: jax.Array, model: GNN,
                  optimizer: optax.GradientTransformation) -> tuple[Params, Any]:
    """``model.init(key)`` and the ``optimizer``'s state for it, in one compiled program, with
    the values the two give op by op. Op by op they compile a program per random draw, sqrt,
    negation and zeros (16 for a 3-layer GCN and adam), each a fraction of a second on a GPU,
    before the first epoch; this program is kept per model and optimizer (`_initializer`).
    `train` does not use it: each new model and optimizer compiles it again (about 1 s on
    CPU-2), which cost a test suite that builds hundreds of them minutes."""
    return _initializer(model, optimizer)(key)


def _initializer(model: GNN, optimizer) -> Callable:
    """The jitted ``key -> (params, opt_state)``, kept for the last 16 models and optimizers
    (an optimizer that is not hashable gets a new one, compiled again, each time)."""
    try:
        return _cached_initializer(model, optimizer)
    except TypeError:  # an unhashable optimizer (or model): compiled for this call only
        return _cached_initializer.__wrapped__(model, optimizer)


@functools.lru_cache(maxsize=16)
def _cached_initializer(model: GNN, optimizer) -> Callable:
    def init(key):
        params = model.init(key)
        return params, optimizer.init(params)
    return jax.jit(init)


def learning_rate(opt_state) -> Optional[float]:
    """The learning rate of the update that produced ``opt_state``, where the state shows
    one: an ``optax.inject_hyperparams`` transformation's ``learning_rate`` (both store the
    values they just applied), times the scale of any ``optax.contrib.reduce_on_plateau``;
    else None."""
    rate, scale = None, 1.0
    for state in jax.tree.leaves(opt_state, is_leaf=lambda x: hasattr(x, "hyperparams")
                                 or hasattr(x, "plateau_count")):
        hyper = getattr(state, "hyperparams", None)
        if rate is None and isinstance(hyper, dict) and "learning_rate" in hyper:
            rate = float(hyper["learning_rate"])
        if hasattr(state, "plateau_count") and hasattr(state, "scale"):
            scale *= float(state.scale)
    return None if rate is None else rate * scale


def _check_loss(loss: Callable, graph: Graph, model: GNN) -> None:
    """TypeError unless ``loss`` takes this graph's logits and labels and gives a value per
    node: traced on shapes alone (`jax.eval_shape`), before anything is written, not a JAX
    shape error at the first step."""
    rows = 16
    logits = jax.ShapeDtypeStruct((rows, model.out_channels), jnp.float32)
    labels = jax.ShapeDtypeStruct((rows, *graph.labels.shape[1:]), graph.labels.dtype)
    what = (f"multi-label targets [n, {graph.num_classes}] int8, -1 unknown"
            if graph.multilabel else "class ids [n] int32")
    try:
        out = jax.eval_shape(loss, logits, labels)
    except Exception as err:  # whatever the function raises on these shapes
        message = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise TypeError(f"the loss {loss!r} fails on this graph's labels ({what}) and logits "
                        f"[n, {model.out_channels}]: {type(err).__name__}: {message}") from None
    if getattr(out, "shape", None) != (rows,) \
            or not jnp.issubdtype(getattr(out, "dtype", jnp.int32), jnp.floating):
        raise TypeError(f"the loss must give one float value per node ([n]); {loss!r} gives "
                        f"{getattr(out, 'shape', out)} {getattr(out, 'dtype', '')} for logits "
                        f"[{rows}, {model.out_channels}] and {what}")
    if graph.multilabel:  # a loss that trains on -1 as a target: said, not silently learnt
        unknown = loss(jnp.ones((1, model.out_channels), jnp.float32),
                       jnp.full((1, graph.num_classes), -1, graph.labels.dtype))
        if float(jnp.abs(unknown[0])) > 0:
            warnings.warn(f"the loss {loss!r} gives {float(unknown[0]):.4g}, not 0, for a node "
                          "whose targets are all unknown (-1): it seems to train on -1 as a "
                          "target; leave out targets < 0 (jgrind.loss.binary_cross_entropy "
                          "does)", stacklevel=3)


def _host_loss(node_loss: Optional[Callable]) -> Callable:
    """The mean of ``node_loss`` over a mask's nodes, on host logits (the ``val_loss``)."""
    if node_loss is None:
        return cross_entropy

    def mean_loss(logits, labels, mask) -> float:
        keep = mask & ((labels >= 0).any(axis=1) if labels.ndim == 2 else labels >= 0)
        if not keep.any():
            return float("nan")
        return float(jnp.mean(node_loss(jnp.asarray(logits[keep]), jnp.asarray(labels[keep]))))
    return mean_loss


def make_executor(graph: Graph, model: GNN, optimizer, *, split: int = 0, policy=None,
                  num_parts: Optional[int] = None, store=None,
                  device_budget: Optional[int] = None, host_budget: Optional[int] = None,
                  partitioner=None, loss: Optional[Callable] = None,
                  devices=None) -> Executor:
    """The executor `jgrind.plan.execution.choose_execution` decides on: the in-memory fast
    path when it is asked for, or when everything fits the device budget and no policy forces
    offloading; otherwise the out-of-core engine. With ``devices`` (a number or a sequence of
    ``jax.Device``), the model data-parallel over them (`jgrind.devices.Sharded`), its
    partitions in memory on their devices; with out-of-core arguments too, the out-of-core
    engine with each partition's steps on its device (`jgrind.devices.ShardedOutOfCore`).

    A policy that plans the whole run (`jgrind.plan.auto`) chooses the fast path, or the
    partitions and fates the engine then runs. ``in_memory_bytes(graph, model)`` is the fast
    path's peak, the figure a device budget is held against."""
    return _make_executor(graph, model, optimizer, split=split, policy=policy,
                          num_parts=num_parts, store=store, device_budget=device_budget,
                          host_budget=host_budget, partitioner=partitioner, loss=loss,
                          devices=devices)[0]


def _make_executor(graph: Graph, model: GNN, optimizer, *, split: int = 0, policy=None,
                   num_parts: Optional[int] = None, store=None,
                   device_budget: Optional[int] = None, host_budget: Optional[int] = None,
                   partitioner=None, loss: Optional[Callable] = None,
                   devices=None) -> tuple[Executor, Optional[Replanner]]:
    """`make_executor`, and the `Replanner` of a run whose policy plans and re-plans (None
    for any other)."""
    device_budget = check_budget(device_budget, "device_budget")
    host_budget = check_budget(host_budget, "host_budget")
    if policy is not None:
        check_policy(policy)
    if num_parts is not None:
        whole_number(num_parts, "num_parts (None: 4, or the planner's choice)")
    elif getattr(partitioner, "num_parts", None) is not None:
        num_parts = partitioner.num_parts  # a saved assignment's own count, on every path
    if devices is not None:
        out_of_core = [name for name, value in (("policy", policy), ("store", store),
                                                ("device_budget", device_budget),
                                                ("host_budget", host_budget))
                       if value is not None]
        kwargs = {} if partitioner is None else {"partitioner": partitioner}
        if out_of_core == ["device_budget"]:  # the planner's route: in memory if it fits
            from jgrind.devices.choose import choose
            return choose(graph, model, optimizer, devices=devices, num_parts=num_parts,
                          device_budget=device_budget, split=split, loss=loss,
                          **kwargs), None
        if out_of_core:  # host and SSD tiers: halo rows exchanged through host memory
            from jgrind.devices import ShardedOutOfCore
            from jgrind.devices.out_of_core import through_host_policy
            return ShardedOutOfCore(
                graph, model, optimizer, devices=devices, num_parts=num_parts, split=split,
                loss=loss, policy=through_host_policy() if policy is None else policy,
                store=store, device_budget=device_budget, host_budget=host_budget,
                **kwargs), None
        return Sharded(graph, model, optimizer, devices=devices, num_parts=num_parts,
                       split=split, loss=loss, **kwargs), None
    chosen = choose_execution(graph, model, policy=policy, num_parts=num_parts, store=store,
                              device_budget=device_budget, host_budget=host_budget,
                              partitioner=partitioner)
    if chosen.in_memory:
        return InMemory(graph, model, optimizer, split, loss=loss), None
    replanner = None
    if chosen.plan is not None and getattr(policy, "replan", False) and optimizer is not None:
        from jgrind.plan.planner import dense_parameter_count
        from jgrind.plan.inventory import layer_widths
        replanner = Replanner(
            chosen.plan, policy.load_profile(None if store is None else str(store)),
            dense_parameter_count(layer_widths(model, graph.num_features)),
            recompute=policy.recompute, keep=policy.keep_aggregations)
    return _engine(graph, model, optimizer, chosen, split=split, store=store,
                   device_budget=device_budget, host_budget=host_budget,
                   partitioner=partitioner, loss=loss), replanner


def _engine(graph: Graph, model: GNN, optimizer, chosen: Execution, *, split: int, store,
            device_budget, host_budget, partitioner, loss) -> OutOfCore:
    """The out-of-core engine for what `choose_execution` chose."""
    kwargs = {} if partitioner is None or chosen.partitioned is not None else \
        {"partitioner": partitioner}
    engine = OutOfCore(graph, model, optimizer, policy=chosen.policy,
                       num_parts=chosen.num_parts, partitioned=chosen.partitioned, split=split,
                       store=store, device_budget=device_budget, host_budget=host_budget,
                       loss=loss, prediction=chosen.prediction, **kwargs)
    if engine.prediction is None and optimizer is not None:
        # a fixed policy: its epochs are held against the cost model's price of its fates,
        # from the saved profile where one is current (`jgrind.plan.check.engine_prediction`)
        from jgrind.plan.check import engine_prediction
        from jgrind.plan.inventory import layer_widths
        from jgrind.plan.planner import dense_parameter_count
        try:
            engine.prediction = engine_prediction(
                engine, dense_parameter_count(layer_widths(model, graph.num_features)),
                directory=None if store is None else str(store))
        except BaseException:  # an error, or a signal (Ctrl-C, SIGTERM), while pricing:
            engine.close()     # the caller never holds the engine, so its store files go here
            raise
    return engine


def _ssd_free(directory, executor) -> Optional[int]:
    """Bytes free in the store's ``directory`` once ``executor``'s own files are gone (a
    re-plan removes them before the new store is made); None without a store."""
    if directory is None:
        return None
    from jgrind.hostio import disk_space
    try:
        free = disk_space.free_bytes(directory)
    except OSError:
        return None
    return free + int(executor.store.accounts.ssd)


def _say(line: str, bar) -> None:
    """Print ``line`` above the progress ``bar`` if there is one (a plain print would break
    it in two)."""
    if hasattr(bar, "write"):
        bar.write(line)
    else:
        print(line, flush=True)


def _progress(iterable, enabled: bool, **kwargs):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm
    return tqdm(iterable, leave=False, dynamic_ncols=True, **kwargs)


# -- reproducible trials ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Trials:
    """Results of one configuration over several seeds."""

    seeds: tuple
    results: tuple  # TrainResult per seed
    metric: str

    @property
    def tests(self) -> np.ndarray:
        return np.array([r.test for r in self.results])

    @property
    def vals(self) -> np.ndarray:
        """The best validation metric of every seed."""
        return np.array([r.val for r in self.results])

    @property
    def mean(self) -> float:
        return float(self.tests.mean())

    @property
    def std(self) -> float:
        """The sample standard deviation of the test metric (ddof 1, as ``torch.std`` and the
        PyG / OGB example scripts report it); 0 for one seed."""
        return _sample_std(self.tests)

    @property
    def val_mean(self) -> float:
        return float(self.vals.mean())

    @property
    def val_std(self) -> float:
        return _sample_std(self.vals)

    def summary(self) -> str:
        return (f"test {self.metric}: {100 * self.mean:.2f} +- {100 * self.std:.2f} % "
                f"over {len(self.seeds)} seed{'' if len(self.seeds) == 1 else 's'}")


def _sample_std(values: np.ndarray) -> float:
    return float(values.std(ddof=1)) if values.size > 1 else 0.0


def run_trials(run: Callable[[int], TrainResult], seeds: Sequence[int]) -> Trials:
    """Call ``run(seed)`` for every seed; ``run`` builds its key from the seed, so the same seed
    gives the same numbers."""
    seeds = list(seeds)
    if not seeds:
        raise ValueError("run_trials needs at least one seed, e.g. seeds=range(10)")
    results = tuple(run(int(s)) for s in seeds)
    metric = results[0].metric if results else "accuracy"
    return Trials(seeds=tuple(int(s) for s in seeds), results=results, metric=metric)
