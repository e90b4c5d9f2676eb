"""The tensor inventory: every stored block of an epoch, from shapes alone (nothing allocated).

An epoch is a sequence of sweeps, each over all partitions:

    step l          (0 <= l < L-1)   forward of layer l: reads H_l, writes H_{l+1}
    step L-1+k      (0 <= k < L)     backward of layer l = L-1-k: reads H_l and G_{l+1}
                                     (the loss for the top layer), writes G_l (l > 0)

A layer below the top with an aggregation split (`jgrind.models.conv.aggregation_split`)
also has an aggregation ``Z_l``: written by its forward step, read by its backward step
instead of ``H_l`` when the policy keeps it.

The top layer's forward is fused into its backward (loss and gradient in one step), so its
output, the logits, is never stored. ``H_0`` are the node features.
"""

from __future__ import annotations

from jgrind.models.conv import aggregation_split
from jgrind.executed.split import as_executed
from jgrind.plan.fates import ACTIVATION, AGGREGATION, GRADIENT, TensorInfo


def layer_widths(model, num_features: int) -> list[int]:
    """Width of ``H_l`` (the input of layer l) for every layer, and of the output last."""
    widths = [num_features]
    for layer in model.layers:
        if layer.in_channels != widths[-1]:
            raise ValueError(f"layer {len(widths) - 1} expects {layer.in_channels} input "
                             f"channels but receives {widths[-1]}")
        widths.append(getattr(layer, "width", layer.out_channels))
    return widths


def dense_products(layer) -> int:
    """Dense ``[in, out]`` products a layer makes per input row: 1, or a relational layer's
    relations plus its self-connection."""
    return int(getattr(layer, "dense_products", 1))


def backward_step(layer: int, num_layers: int) -> int:
    return num_layers - 1 + (num_layers - 1 - layer)


def aggregation_widths(model) -> dict:
    """``{l: width of Z_l}`` for the layers below the top that have an aggregation split (the
    top layer runs once, fused with the loss, so there is nothing to keep for it)."""
    splits = {l: aggregation_split(layer) for l, layer in enumerate(model.layers[:-1])}
    return {l: s.width for l, s in splits.items() if s is not None}


def build_inventory(model, pg, itemsize: int = 4) -> list[TensorInfo]:
    """All activation, gradient and aggregation blocks of one epoch of ``model`` on ``pg``,
    its layers taken as the engine runs them (`jgrind.executed.split.as_executed`)."""
    model = as_executed(model)[0]
    num_layers = len(model.layers)
    widths = layer_widths(model, pg.graph.num_features)
    aggregated = aggregation_widths(model)
    infos = []
    for part in pg.partitions:
        rows = part.num_owned
        for l in range(num_layers):
            width = widths[l]
            prev_cost = 0.0
            if l > 0:
                # one sparse product over the block's in-edges at the narrower width plus the
                # dense transform of its rows (a relational layer: one per relation and one
                # for the self-connection): what rerunning layer l-1 for this block costs
                prev_cost = 2.0 * part.num_edges * min(widths[l - 1], width) \
                    + 2.0 * part.num_inputs * widths[l - 1] * width \
                    * dense_products(model.layers[l - 1])
            infos.append(TensorInfo(
                name=ACTIVATION, layer=l, partition=part.index, shape=(rows, width),
                dtype="float32", nbytes=rows * width * itemsize, recompute_flops=prev_cost,
                produced=l - 1, last_forward_use=l if l < num_layers - 1 else -1,
                first_backward_use=backward_step(l, num_layers), num_layers=num_layers,
                num_partitions=pg.num_parts))
            if l > 0:
                infos.append(TensorInfo(
                    name=GRADIENT, layer=l, partition=part.index, shape=(rows, width),
                    dtype="float32", nbytes=rows * width * itemsize,
                    produced=backward_step(l, num_layers),
                    first_backward_use=backward_step(l - 1, num_layers),
                    num_layers=num_layers, num_partitions=pg.num_parts))
            if l in aggregated:
                width = aggregated[l]
                infos.append(TensorInfo(
                    name=AGGREGATION, layer=l, partition=part.index, shape=(rows, width),
                    dtype="float32", nbytes=rows * width * itemsize,
                    # what keeping it saves: the sparse product rerun in backward
                    recompute_flops=2.0 * part.num_edges * widths[l],
                    produced=l, last_forward_use=-1,
                    first_backward_use=backward_step(l, num_layers),
                    num_layers=num_layers, num_partitions=pg.num_parts))
    return infos

