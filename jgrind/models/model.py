"""`GNN`: a model as a sequence of layers plus the whole-graph normalisation it needs.

Parameters are a plain tuple of per-layer dicts, created from a PRNG key. ``apply`` runs all
layers on one block (the in-memory path); the out-of-core engine instead calls the layers one at a
time on per-partition blocks. Both call the same layer objects, so they compute the same function.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable, Optional, Sequence

import jax

from jgrind import transforms
from jgrind.arguments import whole_number
from jgrind.graph import Graph, GraphError
from jgrind.models.block import Block, full_block
from jgrind.models.conv import LayerOptions
from jgrind.models.gat import GATConv
from jgrind.models.gcn import GCNConv
from jgrind.models.linear import Linear
from jgrind.models.rgat import RGATConv
from jgrind.models.rgcn import RGCNConv
from jgrind.models.sage import SAGEConv

Params = tuple  # one dict per layer


@dataclasses.dataclass(frozen=True)
class GNN:
    """A graph neural network as data.

    Attributes:
      layers: the layer objects, applied in order. Each has ``init(key) -> dict`` and
        ``__call__(params, block, h, key) -> h'`` and a class flag ``aggregates`` (whether it
        reads neighbours, i.e. needs a halo).
      normalize: whole-graph preprocessing that sets the edge weights the layers aggregate with
        (e.g. `transforms.gcn_norm`). Computed once per graph, before any partitioning.
      needs_adjacency / needs_edges: which block pieces the layers read.
      name: for logs.
    """

    layers: tuple
    normalize: Callable[[Graph], Graph]
    needs_adjacency: bool
    needs_edges: bool
    name: str = "gnn"

    def init(self, key: jax.Array) -> Params:
        keys = jax.random.split(key, len(self.layers))
        return tuple(layer.init(k) for layer, k in zip(self.layers, keys))

    def block(self, normalized: Graph) -> Block:
        """The whole (already normalised) graph as one block, on the host."""
        return full_block(normalized, needs_edges=self.needs_edges,
                          needs_adjacency=self.needs_adjacency)

    def apply(self, params: Params, block: Block, x: jax.Array,
              key: Optional[jax.Array] = None, num_layers: Optional[int] = None) -> jax.Array:
        """Logits ``[num_out, C]``; with ``num_layers``, the output of the first that many
        layers instead (node embeddings; 0: ``x``). ``key`` enables dropout; None means
        evaluation."""
        h = x
        stop = len(self.layers) if num_layers is None else num_layers
        for i, (layer, p) in enumerate(zip(self.layers[:stop], params)):
            h = layer(p, block, h, layer_key(key, i))
        return h

    @property
    def out_channels(self) -> int:
        last = self.layers[-1]
        return last.width if isinstance(last, (GATConv, RGATConv)) else last.out_channels

    @property
    def in_channels(self) -> int:
        return self.layers[0].in_channels

    def check_layer(self, layer) -> int:
        """``layer`` if it names an embedding of this model: 0 (the features) to its number
        of layers (the logits); else ValueError."""
        whole_number(layer, "layer", least=0)
        if layer > len(self.layers):
            raise ValueError(f"layer {layer} does not exist: the {self.name} model has "
                             f"{len(self.layers)} layers; ask for 0 (the features) to "
                             f"{len(self.layers)} (the logits)")
        return int(layer)

    def check_fits(self, graph: Graph) -> None:
        """GraphError unless this model takes ``graph``'s features and predicts its classes:
        said here, not as a shape error inside a jitted step (or a NaN loss) later."""
        if self.in_channels != graph.num_features:
            raise GraphError(f"the {self.name} model takes {self.in_channels} input features "
                             f"but {graph.name} has {graph.num_features}; build it with "
                             "in_channels=graph.num_features")
        if graph.multilabel and self.out_channels != graph.num_classes:
            raise GraphError(f"the {self.name} model has {_outputs(self.out_channels)} but "
                             f"{graph.name} has {graph.num_classes} binary targets per node (a "
                             "logit each); build it with out_channels=graph.num_classes")
        relations = {getattr(layer, "num_relations", None) for layer in self.layers} - {None}
        if relations and relations != {graph.num_relations}:
            raise GraphError(f"the {self.name} model is built for {min(relations)} relation(s) "
                             f"but {graph.name} has {graph.num_relations}; build it with "
                             "num_relations=graph.num_relations")
        if self.out_channels < graph.num_classes:  # (more outputs than classes: unused logits)
            raise GraphError(f"the {self.name} model has {_outputs(self.out_channels)} but "
                             f"{graph.name} has {graph.num_classes} classes; build it with "
                             "out_channels=graph.num_classes")


def layer_key(key: Optional[jax.Array], layer: int) -> Optional[jax.Array]:
    """The dropout key of one layer: the same in the in-memory path and in the engine."""
    return None if key is None else jax.random.fold_in(key, layer)


def _widths(in_channels: int, hidden: int | Sequence[int], num_layers: int) -> list[int]:
    if isinstance(hidden, int):
        return [hidden] * (num_layers - 1)
    hidden = list(hidden)
    if len(hidden) != num_layers - 1:
        raise ValueError(f"hidden sizes {hidden} give {len(hidden) + 1} layers, but "
                         f"num_layers={num_layers}; pass num_layers={len(hidden) + 1}")
    return hidden


def _check_model_arguments(in_channels, hidden, out_channels, num_layers, dropout,
                           activation) -> None:
    """ValueError naming the argument: not a shape error deep inside a jitted step later."""
    whole_number(in_channels, "in_channels (the graph's number of features)")
    whole_number(out_channels, "out_channels (the number of classes)")
    whole_number(num_layers, "num_layers")
    for width in ([hidden] if isinstance(hidden, numbers.Number) or isinstance(hidden, str)
                  else list(hidden)):
        whole_number(width, "hidden_channels")
    if not (isinstance(dropout, numbers.Real) and 0 <= dropout < 1):
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
    if activation is not None and not callable(activation):
        raise ValueError(f"activation must be a function such as jax.nn.relu, got "
                         f"{activation!r}")


def _stack(conv: Callable[..., Any], in_channels: int, hidden, out_channels: int, *,
           num_layers: int, dropout: float, residual: bool, layer_norm: bool,
           activation) -> tuple:
    """Plain stack conv -> ... -> conv (logits), or, with residual=True, the residual design of
    Platonov et al. (2023): Linear in -> num_layers residual conv blocks -> LayerNorm + Linear out.
    """
    _check_model_arguments(in_channels, hidden, out_channels, num_layers, dropout, activation)
    if not residual:
        widths = [in_channels, *_widths(in_channels, hidden, num_layers), out_channels]
        layers = []
        for i in range(num_layers):
            last = i == num_layers - 1
            opts = LayerOptions(dropout=dropout, activation=None if last else activation,
                                layer_norm=layer_norm and i > 0, residual=False)
            layers.append(conv(widths[i], widths[i + 1], opts, last))
        return tuple(layers)
    width = hidden if isinstance(hidden, int) else hidden[0]
    if not isinstance(hidden, int) and len(set(hidden)) != 1:
        raise ValueError("residual models need one hidden width for all blocks, got "
                         f"{list(hidden)}")
    layers = [Linear(in_channels, width, LayerOptions(activation=activation))]
    block_opts = LayerOptions(dropout=dropout, activation=activation, layer_norm=layer_norm,
                              residual=True)
    layers += [conv(width, width, block_opts, False) for _ in range(num_layers)]
    layers.append(Linear(width, out_channels, LayerOptions(layer_norm=layer_norm)))
    return tuple(layers)


def gcn(in_channels: int, hidden_channels: int | Sequence[int], out_channels: int, *,
        num_layers: int = 2, dropout: float = 0.5, residual: bool = False,
        layer_norm: bool = False, activation=jax.nn.relu) -> GNN:
    """GCN. Defaults are Kipf & Welling's: 2 layers, ReLU, dropout 0.5 before each layer."""
    make = lambda i, o, opts, last: GCNConv(i, o, opts)  # noqa: E731
    layers = _stack(make, in_channels, hidden_channels, out_channels, num_layers=num_layers,
                    dropout=dropout, residual=residual, layer_norm=layer_norm,
                    activation=activation)
    return GNN(layers, _gcn_normalize, needs_adjacency=True, needs_edges=False, name="gcn")


def sage(in_channels: int, hidden_channels: int | Sequence[int], out_channels: int, *,
         num_layers: int = 2, dropout: float = 0.5, residual: bool = False,
         layer_norm: bool = False, activation=jax.nn.relu) -> GNN:
    """GraphSAGE with mean aggregation and a root weight (PyG ``SAGEConv`` defaults)."""
    make = lambda i, o, opts, last: SAGEConv(i, o, opts)  # noqa: E731
    layers = _stack(make, in_channels, hidden_channels, out_channels, num_layers=num_layers,
                    dropout=dropout, residual=residual, layer_norm=layer_norm,
                    activation=activation)
    return GNN(layers, _sage_normalize, needs_adjacency=True, needs_edges=False, name="sage")


def _homogeneous(graph: Graph) -> Graph:
    """``graph`` without relation ids: the models that do not read relations see one edge
    set (the union of the relations)."""
    if graph.edge_type is None:
        return graph
    return graph.replace(edge_type=None, relations=())


def _gcn_normalize(graph: Graph) -> Graph:
    return transforms.gcn_norm(_homogeneous(graph))


def _sage_normalize(graph: Graph) -> Graph:
    return transforms.mean_norm(transforms.remove_self_loops(_homogeneous(graph)))


def _gat_normalize(graph: Graph) -> Graph:
    return transforms.add_self_loops(_homogeneous(graph).replace(edge_weight=None))


def _rgat_normalize(graph: Graph) -> Graph:
    return graph.replace(edge_weight=None)


def gat(in_channels: int, hidden_channels: int, out_channels: int, *, num_layers: int = 2,
        heads: int = 8, output_heads: int = 1, dropout: float = 0.6,
        attention_dropout: Optional[float] = None, residual: bool = False,
        layer_norm: bool = False, activation=jax.nn.elu) -> GNN:
    """GAT. Defaults are Velickovic et al.'s Cora model: 8 heads x 8 hidden, concatenated, ELU,
    dropout 0.6 on inputs and attention, one output head averaged. ``hidden_channels`` is per head.
    """
    att = dropout if attention_dropout is None else attention_dropout
    whole_number(heads, "heads")
    whole_number(output_heads, "output_heads")
    if not (isinstance(att, numbers.Real) and 0 <= att < 1):
        raise ValueError(f"attention_dropout must be in [0, 1), got {att!r}")

    def make(i, o, opts, last):
        if last:
            return GATConv(i, o, heads=output_heads, concat=False, attention_dropout=att,
                           options=opts)
        per_head = o // heads
        if per_head * heads != o:
            raise ValueError(f"GAT width {o} is not a multiple of heads={heads}")
        return GATConv(i, per_head, heads=heads, concat=True, attention_dropout=att,
                       options=opts)

    width = hidden_channels * heads
    layers = _stack(make, in_channels, width, out_channels, num_layers=num_layers,
                    dropout=dropout, residual=residual, layer_norm=layer_norm,
                    activation=activation)
    return GNN(layers, _gat_normalize, needs_adjacency=False, needs_edges=True, name="gat")


def rgcn(in_channels: int, hidden_channels: int | Sequence[int], out_channels: int,
         num_relations: int = 1, *, num_layers: int = 2, dropout: float = 0.5,
         residual: bool = False, layer_norm: bool = False, activation=jax.nn.relu,
         num_bases: Optional[int] = None, num_blocks: Optional[int] = None,
         self_loop: bool = True) -> GNN:
    """R-GCN (Schlichtkrull et al. 2018) over ``num_relations`` relations (the graph's
    `Graph.num_relations`; 1 for a graph without relations): a weight per relation, or
    ``num_bases`` shared bases, or ``num_blocks`` diagonal blocks; the per-relation mean
    (`jgrind.transforms.relation_mean_norm`); a self-connection. The features have one width
    for every node type (narrower types zero-padded when the graph is built).

    ``num_blocks`` applies to the layers whose two widths it divides; a layer whose widths it
    does not divide (the logits layer of 3 classes, say) has a dense weight per relation."""
    whole_number(num_relations, "num_relations")
    for value, name in ((num_bases, "num_bases"), (num_blocks, "num_blocks")):
        if value is not None:  # (0: no decomposition)
            whole_number(value, name, least=0)

    def make(i, o, opts, last):
        blocks = num_blocks if num_blocks and not (i % num_blocks or o % num_blocks) else None
        return RGCNConv(i, o, num_relations, num_bases=num_bases, num_blocks=blocks,
                        self_loop=self_loop, options=opts)
    layers = _stack(make, in_channels, hidden_channels, out_channels, num_layers=num_layers,
                    dropout=dropout, residual=residual, layer_norm=layer_norm,
                    activation=activation)
    return GNN(layers, transforms.relation_mean_norm, needs_adjacency=True, needs_edges=False,
               name="rgcn")


def rgat(in_channels: int, hidden_channels: int, out_channels: int, num_relations: int = 1, *,
         num_layers: int = 2, heads: int = 4, output_heads: int = 1, dropout: float = 0.5,
         attention_dropout: Optional[float] = None, residual: bool = False,
         layer_norm: bool = False, activation=jax.nn.relu, self_loop: bool = True) -> GNN:
    """RGAT (Busbridge et al. 2019) with across-relation attention over ``num_relations``
    relations: ``heads`` heads of ``hidden_channels`` each, concatenated, in hidden layers,
    ``output_heads`` averaged in the last; a weight per relation and a self-connection."""
    whole_number(num_relations, "num_relations")
    whole_number(heads, "heads")
    whole_number(output_heads, "output_heads")
    att = dropout if attention_dropout is None else attention_dropout
    if not (isinstance(att, numbers.Real) and 0 <= att < 1):
        raise ValueError(f"attention_dropout must be in [0, 1), got {att!r}")

    def make(i, o, opts, last):
        if last:
            return RGATConv(i, o, num_relations, heads=output_heads, concat=False,
                            attention_dropout=att, self_loop=self_loop, options=opts)
        per_head = o // heads
        if per_head * heads != o:
            raise ValueError(f"RGAT width {o} is not a multiple of heads={heads}")
        return RGATConv(i, per_head, num_relations, heads=heads, concat=True,
                        attention_dropout=att, self_loop=self_loop, options=opts)

    layers = _stack(make, in_channels, hidden_channels * heads, out_channels,
                    num_layers=num_layers, dropout=dropout, residual=residual,
                    layer_norm=layer_norm, activation=activation)
    return GNN(layers, _rgat_normalize, needs_adjacency=False, needs_edges=True, name="rgat")


def _outputs(n: int) -> str:
    return f"{n} output" if n == 1 else f"{n} outputs"
