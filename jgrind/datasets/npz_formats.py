"""Which graph format an ``.npz`` file holds, told by its keys, so that ``npz:PATH`` reads any
of them whatever the file is called.

- ``gnn-benchmark`` (Shchur et al., `load_gnn_benchmark`): ``adj_*`` / ``adj_matrix.*`` CSR
  pieces, ``attr_*`` / ``attr_matrix*``, ``labels``; no fixed split (random ones are drawn).
- ``heterophilous`` (Platonov et al., `load_heterophilous`): ``node_features``,
  ``node_labels``, ``edges``, ``train_masks`` / ``val_masks`` / ``test_masks``; fixed splits.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

from jgrind.datasets.errors import DatasetError, not_npz_problem, require_file
from jgrind.datasets.heterophilous import KEYS as HETEROPHILOUS_KEYS

GNN_BENCHMARK, HETEROPHILOUS = "gnn-benchmark", "heterophilous"
HINT = ("pass the path of an .npz from shchur/gnn-benchmark (adj_*, attr_*, labels) or from "
        "yandex-research/heterophilous-graphs (node_features, node_labels, edges, *_masks)")


def npz_keys(path: Path) -> list[str]:
    """The array names of the ``.npz`` at `path`, reading only the archive's directory."""
    path = require_file(path, "dataset file", HINT)
    problem = not_npz_problem(path)
    if problem:
        raise DatasetError(f"cannot read {path}: {problem}; {HINT}")
    try:
        with zipfile.ZipFile(path) as archive:
            return [n[:-4] for n in archive.namelist() if n.endswith(".npy")]
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as e:
        raise DatasetError(f"cannot read {path}: the archive is truncated or damaged "
                           f"({type(e).__name__}: {e}); {HINT}") from e


def npz_format(path) -> str:
    """`GNN_BENCHMARK` or `HETEROPHILOUS` by the keys of the file at `path`; `DatasetError`
    naming the keys it has when they are of neither."""
    keys = npz_keys(Path(path))
    if any(k in HETEROPHILOUS_KEYS for k in keys):
        return HETEROPHILOUS
    if "labels" in keys or any(k.startswith(("adj_", "attr_")) for k in keys):
        return GNN_BENCHMARK
    raise DatasetError(f"{path} holds no graph format jgrind knows (its keys: "
                       f"{', '.join(keys) or 'none'}); {HINT}")
