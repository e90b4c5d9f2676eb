"""jgrind: exact full-graph GNN training in JAX."""
