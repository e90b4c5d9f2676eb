"""GNN models as pure functions: layers, blocks and model factories."""

from jgrind.models.block import Block, full_block, make_block
from jgrind.models.conv import LayerOptions
from jgrind.models.dropout import dropout
from jgrind.models.gat import GATConv
from jgrind.models.gcn import GCNConv
from jgrind.models.linear import Linear
from jgrind.models.model import GNN, gat, gcn, layer_key, rgat, rgcn, sage
from jgrind.models.rgat import RGATConv
from jgrind.models.rgcn import RGCNConv
from jgrind.models.sage import SAGEConv

__all__ = ["Block", "GATConv", "GCNConv", "GNN", "LayerOptions", "Linear", "RGATConv",
           "RGCNConv", "SAGEConv", "dropout", "full_block", "gat", "gcn", "layer_key",
           "make_block", "rgat", "rgcn", "sage"]
