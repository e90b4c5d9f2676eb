"""jgrind: exact full-graph GNN training in JAX, in memory or partition by partition with
device / host / SSD offloading.

The data flow, one module group per stage (no module imports a later stage):

    graph, transforms, datasets, generators  ->  partition  ->  plan (fates, policies)
    ->  engine (store, out-of-core executor)  ->  train (trainer, trials, checkpoints,
    predictions)
"""

from jgrind import compile_cache, datasets, generators, interop, models, transforms
from jgrind.graph import Graph, GraphError, from_edges
from jgrind.plan import Fate, TensorInfo, policies
from jgrind.train import TrainResult, Trials, run_trials, train
from jgrind.inference import load_checkpoint, predict
from jgrind.engine import machinery as _machinery
from jgrind.plan import profile as _profile

# every profile measured measures the engine's own cost per step by running it
# (`jgrind.plan.profile.use_machinery`: the plan layer cannot import the engine)
_profile.use_machinery(_machinery.measure)

__version__ = "0.1.0"

__all__ = ["Fate", "Graph", "GraphError", "TensorInfo", "TrainResult", "Trials", "compile_cache",
           "datasets", "from_edges", "generators", "interop", "load_checkpoint", "models",
           "policies", "predict", "run_trials", "train", "transforms"]
