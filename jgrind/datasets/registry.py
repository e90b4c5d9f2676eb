"""Datasets by name: ``load("cora")``, ``available()``, and `register` for generated graphs.

Built-in names map to a loader and a path under the data root. Besides names, `load` takes
``"ogb:/dir"`` (`load_ogb_raw`), ``"npz:/file.npz"`` (`load_gnn_benchmark` or
`load_heterophilous`, by the file's keys: `npz_formats`) and
``"edgelist:/dir/edges.txt"`` (`load_edge_list`: features.npy and labels.npy beside it, or
features_path= and labels_path=),
``"npy:/folder"`` (`load_saved`: a graph saved by `save_graph`, memory-mapped),
``"hgsl:/folder"`` (`load_hgsl`: an HGSL/GTN heterogeneous dataset's pickles) and
``"mag-like:SCALE"`` (`mag_like`: the generated ogbn-mag-sized graph at that scale).
Heterogeneous datasets (``dblp``, ``hgsl:``, a heterogeneous ``ogb:`` folder, ``mag-like``)
arrive as the `Graph` of `jgrind.hetero.HeteroGraph.to_graph`, with edge types.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Callable, Optional

from jgrind.datasets.edgelist import draws_random_splits, load_edge_list
from jgrind.datasets.errors import DatasetError
from jgrind.datasets.generated_hetero import mag_like
from jgrind.datasets.gnn_benchmark import gnn_benchmark_path, load_gnn_benchmark
from jgrind.datasets.hgsl import FILES as HGSL_FILES
from jgrind.datasets.hgsl import load_hgsl
from jgrind.datasets.heterophilous import load_heterophilous
from jgrind.datasets.npz_formats import GNN_BENCHMARK, HETEROPHILOUS, npz_format
from jgrind.datasets.ogb import load_ogb_raw
from jgrind.datasets.paths import data_root, require_root
from jgrind.datasets.planetoid import PARTS, load_planetoid
from jgrind.datasets.stored import load_saved
from jgrind.graph import Graph
from jgrind.transforms import largest_connected_component


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """One row of `available()`. `path` is None for generated graphs (always present)."""

    name: str
    format: str
    description: str
    path: Optional[str]
    present: bool


@dataclasses.dataclass(frozen=True)
class _Builtin:
    format: str
    description: str
    files: tuple  # paths relative to the data root; all must exist; files[0] is shown
    load: Callable  # (root: Path, **kwargs) -> Graph


def _check_options(loader: Callable, options: dict, what: str, given: int = 1,
                   fixed=()) -> None:
    """DatasetError if ``options`` holds a keyword ``loader`` does not take (besides its first
    ``given`` arguments and the ``fixed`` ones, which `load` passes itself), naming the ones it
    takes: not a TypeError about an internal function."""
    params = list(inspect.signature(loader).parameters.values())[given:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return  # a registered function that takes anything: it says what it does not take
    takes = [p.name for p in params if p.name not in fixed
             and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in options if k not in takes]
    if unknown:
        raise DatasetError(f"{what} takes no option {unknown[0]!r}; it takes "
                           f"{', '.join(takes) if takes else 'none'}")


def _planetoid(name: str, description: str) -> _Builtin:
    files = tuple(f"planetoid/ind.{name}.{p}" for p in PARTS)

    def load(root, **options):
        _check_options(load_planetoid, options, f"dataset {name!r}", given=2)
        return load_planetoid(name, root, **options)
    return _Builtin("planetoid", description, files, load)


def _npz(fmt: str, rel: str, description: str, loader, **fixed) -> _Builtin:
    def load(root, **options):
        what = f"dataset {fixed.get('name', Path(rel).stem)!r}"
        _check_options(loader, options, what, given=1, fixed=("root", *fixed))
        return loader(str(Path(root) / rel), **{**fixed, **options})
    return _Builtin(fmt, description, (rel,), load)


def _hgsl(name: str, description: str) -> _Builtin:
    folder = f"hgsl/{name}"

    def load(root, **options):
        _check_options(load_hgsl, options, f"dataset {name!r}", fixed=("name",))
        return load_hgsl(Path(root) / folder, name=name, **options)
    return _Builtin("hgsl", description, tuple(f"{folder}/{f}" for f in HGSL_FILES), load)


def _mag_like_graph(scale=1.0, seed=0, homophily=0.6, feature_signal=1.0, inverses=True):
    """``mag-like``: `mag_like` with every relation's inverse (as R-GCN set-ups on ogbn-mag
    add them), as a `Graph`."""
    if not isinstance(inverses, bool):
        raise DatasetError(f"inverses={inverses!r}: use true or false")
    try:
        graph = mag_like(scale=scale, seed=seed, homophily=homophily,
                         feature_signal=feature_signal)
    except ValueError as err:
        raise DatasetError(f"generated dataset 'mag-like': {err}") from None
    return (graph.with_inverses() if inverses else graph).to_graph()


def _mag_like_at(scale: str, **options) -> Graph:
    """``mag-like:SCALE``."""
    try:
        value = float(scale)
    except ValueError:
        raise DatasetError(f"mag-like:{scale}: the scale must be a number in (0, 1], e.g. "
                           "mag-like:0.01") from None
    return _mag_like_graph(scale=value, **options)


_BUILTIN = {
    "cora": _planetoid("cora", "Cora citations, Planetoid public split (140/500/1000)"),
    "citeseer": _planetoid("citeseer", "CiteSeer citations, Planetoid public split "
                                       "(120/500/1000)"),
    "pubmed": _planetoid("pubmed", "PubMed citations, Planetoid public split (60/500/1000)"),
    "tolokers": _npz("heterophilous", "heterophilous/tolokers.npz",
                     "Toloka workers, binary (ROC-AUC), 10 fixed splits", load_heterophilous),
    "minesweeper": _npz("heterophilous", "heterophilous/minesweeper.npz",
                        "Minesweeper grid, binary (ROC-AUC), 10 fixed splits", load_heterophilous),
    "cora-npz": _npz("gnn-benchmark", "gnn-benchmark/cora.npz",
                     "Cora from gnn-benchmark, a random 20/30-per-class split per seed",
                     load_gnn_benchmark, name="cora-npz"),
    "dblp": _hgsl("dblp", "DBLP from HGSL/GTN, heterogeneous (authors, papers, conferences; 4 "
                          "relations), Macro-F1; fixed split 600/300/2057 authors"),
}

_GENERATED: dict[str, tuple[Callable[..., Graph], str]] = {}


def _load_npz(path, **options) -> Graph:
    """``npz:PATH``: the loader of the format the file's keys show (a bare name is a file of
    the data root's gnn-benchmark folder)."""
    path = gnn_benchmark_path(path)
    fmt = npz_format(path)
    loader = _NPZ_LOADERS[fmt]
    _check_options(loader, options, f"{path} (a {fmt} file)")
    return loader(path, **options)


_NPZ_LOADERS = {GNN_BENCHMARK: load_gnn_benchmark, HETEROPHILOUS: load_heterophilous}
_PREFIXES = {"ogb": load_ogb_raw, "npz": _load_npz, "edgelist": load_edge_list,
             "npy": load_saved, "hgsl": load_hgsl, "mag-like": _mag_like_at}
# formats with no fixed split, whose loader draws random ones (`seed`, `splits`) and, taking
# `largest_component` itself, draws them on that component
_RANDOM_SPLITS = (GNN_BENCHMARK,)


def register(name: str, fn: Callable[..., Graph], description: str) -> None:
    """Make ``load(name, **kwargs)`` call ``fn(**kwargs)`` (for generated graphs: no files, no
    data root). Re-registering a name replaces it; built-in names cannot be taken."""
    key = name.lower()
    if key in _BUILTIN or ":" in key:
        raise ValueError(f"cannot register {name!r}: it is a built-in dataset or has a ':'")
    _GENERATED[key] = (fn, description)


def names() -> list[str]:
    """Every name `load` accepts, built-in first."""
    return [*_BUILTIN, *_GENERATED]


def format_of(name: str) -> str:
    """The file format of dataset `name` (a built-in's, ``npz:PATH``'s by its keys, else the
    prefix), or "generated"; "" for an unknown name."""
    prefix, sep, rest = name.partition(":")
    if sep and prefix.lower() == "npz":
        return npz_format(gnn_benchmark_path(rest))
    if sep and prefix.lower() in _PREFIXES:
        return prefix.lower()
    key = name.lower()
    return _BUILTIN[key].format if key in _BUILTIN else "generated" if key in _GENERATED else ""


def split_per_seed(name: str, options: dict) -> bool:
    """Whether a run of several seeds on `name` should draw one split per seed: its format has
    no fixed split and `options` name neither ``splits`` nor ``seed`` (which keep their
    meaning). The run then passes ``seed=`` its first seed and ``splits=`` its number of
    seeds, so that seed ``s`` trains on the split drawn from ``s`` (Shchur et al.'s protocol)."""
    if {"splits", "seed"} & set(options):
        return False
    if format_of(name) == "edgelist":  # random splits unless masks lie beside the edge list
        return draws_random_splits(name.partition(":")[2])
    return format_of(name) in _RANDOM_SPLITS


def load(name: str, /, root=None, **kwargs) -> Graph:
    """The graph called `name` (case-insensitive), or at ``"ogb:/dir"``, ``"npz:/file.npz"``,
    ``"edgelist:/edges.txt"``, ``"npy:/folder"``. `root` overrides the data root for built-in
    names; `kwargs` go to the loader or generator, except ``largest_component=True``, which
    keeps only the graph's largest connected component (`largest_connected_component`; a
    random-split format draws its splits on it)."""
    keep_largest = kwargs.pop("largest_component", False)
    if not isinstance(keep_largest, bool):
        raise DatasetError(f"largest_component={keep_largest!r}: use true or false")
    if keep_largest and format_of(name) in _RANDOM_SPLITS:
        return _load(name, root, {**kwargs, "largest_component": True})
    graph = _load(name, root, kwargs)
    return largest_connected_component(graph) if keep_largest else graph


def _load(name: str, root, kwargs: dict) -> Graph:
    prefix, sep, rest = name.partition(":")
    if sep and prefix.lower() in _PREFIXES:
        loader = _PREFIXES[prefix.lower()]
        _check_options(loader, kwargs, f"loading {prefix.lower()}:PATH")
        return loader(rest, **kwargs)
    key = name.lower()
    if key in _GENERATED:
        make = _GENERATED[key][0]
        _check_options(make, kwargs, f"generated dataset {key!r}", given=0)
        try:
            return make(**kwargs)
        except TypeError as err:  # an option its generator does not take (passed on by **kw)
            if "unexpected keyword argument" not in str(err):
                raise
            raise DatasetError(f"generated dataset {key!r}: {err}") from None
    if key not in _BUILTIN:
        raise DatasetError(f"unknown dataset {name!r}; known names: {', '.join(names())} (or "
                           f"{', '.join(p + ':PATH' for p in _PREFIXES)})")
    entry = _BUILTIN[key]
    base = require_root(root)
    folders = [f for f in entry.files if (base / f).is_dir()]
    if folders:
        raise DatasetError(f"dataset {key!r}: {base / folders[0]} is a folder, not the file it "
                           "should be; put the dataset's file there")
    missing = [f for f in entry.files if not (base / f).is_file()]
    if missing:
        raise DatasetError(f"dataset {key!r} is not in {base}: missing {', '.join(missing)}; "
                           "put the files there or set JGRIND_DATA to a folder that has them")
    return entry.load(base, **kwargs)


def available(root=None) -> list[DatasetInfo]:
    """Every dataset `load` knows, and whether its files are under `root` (default: the data
    root; if there is none, every built-in is absent)."""
    base = Path(root).expanduser() if root is not None else data_root()
    rows = []
    for name, e in _BUILTIN.items():
        present = base is not None and all((base / f).is_file() for f in e.files)
        path = str(base / e.files[0]) if base is not None else None
        rows.append(DatasetInfo(name, e.format, e.description, path, present))
    for name, (_, description) in _GENERATED.items():
        rows.append(DatasetInfo(name, "generated", description, None, True))
    return rows


register("mag-like", _mag_like_graph,
         "ogbn-mag-sized heterogeneous graph (papers, authors, institutions, fields of study; "
         "4 relations plus inverses; 128 features on papers, 349 classes); "
         "dataset_options=scale:0.01 or mag-like:0.01 for a smaller one")
