"""A model rewritten into the layers the engine runs: a GCN layer split into a node-wise
transform and a propagation (`split`), and each layer's input dropout moved into the layer below
(`moved_dropout`). Both the planner, which prices the executed layers, and the engine, which runs
them, read these rewrites, so they sit between `jgrind.models` and `jgrind.plan`."""
