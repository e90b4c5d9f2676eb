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
from jgrind.executed.moved_dropout import unwrap
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
    """Dense ``[in, out]`` products a layer makes: 1, or a relational layer's relations plus
    its self-connection (on which rows each runs, and so its flops: `forward_work`)."""
    return int(getattr(layer, "dense_products", 1))


def forward_work(layer, w_in: int, w_out: int, n_out, n_in) -> tuple:
    """``(sparse width, dense flops)`` of one forward step of ``layer`` (``w_in -> w_out``) on
    ``n_out`` output rows and ``n_in`` input rows (numbers or arrays over partitions): the
    width its sparse product over the block's edges runs at (0: none; attention's edge work
    counts as one at the output width), and its dense products' flops (``2 m k n`` each).
    The cost model prices a step's products from it (`jgrind.plan.cost.layer_products`)
    and the inventory a recompute (`build_inventory`), so the two agree."""
    def mm(rows, a, b):
        return 2.0 * rows * a * b
    layer = unwrap(layer)  # a layer running its consumer's dropout: the same products
    kind = type(layer).__name__
    if kind in ("GCNConv", "SAGEConv"):
        # the sparse product runs before the matmul, on the narrower side: (A X) W on the
        # output rows, or A (X W) with X W on every input row; SAGE adds a root transform of
        # the owned rows
        root = mm(n_out, w_in, w_out) if kind == "SAGEConv" else 0.0
        if w_in <= w_out:
            return w_in, mm(n_out, w_in, w_out) + root
        return w_out, mm(n_in, w_in, w_out) + root
    if kind == "Propagate":  # the aggregation half of a split GCN layer: A U + b, no weight
        return w_out, 0.0 * n_out
    if kind == "RGCNConv":
        # one sparse product over the relation rows at the input width gives each output
        # row's aggregate per relation, [out, R, in]; then the aggregates times the relation
        # weights, on the output rows only, and the self-connection (`jgrind.models.rgcn`)
        relations = float(layer.num_relations)
        if layer.num_bases:  # the relations' aggregates combined per basis, then x V_b
            dense = mm(n_out * float(w_in), relations, layer.num_bases) \
                + mm(n_out, layer.num_bases * w_in, w_out)
        else:  # block-diagonal weights: 1/K of the dense products
            share = 1.0 / layer.num_blocks if layer.num_blocks else 1.0
            dense = share * mm(n_out, relations * w_in, w_out)
        if layer.self_loop:
            dense = dense + mm(n_out, w_in, w_out)
        return w_in, dense
    if kind == "RGATConv":  # every relation's projection of every input row, then GAT's
        # edge work per relation
        dense = mm(n_in, w_in, float(layer.num_relations) * w_out)
        if layer.self_loop:
            dense = dense + mm(n_out, w_in, w_out)
        return w_out, dense
    if kind == "GATConv":  # x W on every input row, then the edge work
        return w_out, mm(n_in, w_in, w_out)
    if getattr(layer, "aggregates", True):
        return min(w_in, w_out), mm(n_out, w_in, w_out)
    return 0, mm(n_out, w_in, w_out)


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
                # what rerunning layer l-1 for this block costs: its sparse product over the
                # block's in-edges and its dense products, as the cost model prices them
                sparse, dense = forward_work(model.layers[l - 1], widths[l - 1], width,
                                             rows, part.num_inputs)
                prev_cost = 2.0 * part.num_edges * sparse + float(dense)
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

