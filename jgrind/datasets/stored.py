"""A `Graph` saved as a folder of ``.npy`` files, and read back memory-mapped.

Parsing a large graph's text files (an OGB download, an edge list) or generating one takes
minutes; its features may not fit in RAM beside the activations. Saved once with `save_graph`
(or ``jgrind convert``), it loads with ``load("npy:/folder")`` with no parsing and no copy:
every array is a read-only ``np.memmap`` of its file. Loading validates the graph as any
other (ids in range, features finite), which reads each file once, a slice at a time; after
that, pages are read when they are used. The out-of-core engine copies the features into its
store partition by partition (`jgrind.engine`), so they go from disk to the store without the
whole matrix ever being in the process's own memory: the pages read are file pages of the
OS's page cache, which it drops again when memory is short.

The folder holds one standard ``.npy`` file per `Graph` field (NumPy, or any reader of the
format, opens them without jgrind) and ``graph.json``: the format's name and version, the
graph's name and counts, and every array's dtype and shape, checked on loading so that a
file replaced or cut short since is an error, not a different graph::

  graph.json  indptr.npy  indices.npy  features.npy  labels.npy
  train_mask.npy  val_mask.npy  test_mask.npy  [edge_weight.npy]  [edge_type.npy]

A heterogeneous graph's relation names and node types are kept in ``graph.json``.

A save writes into a hidden ``.NAME.partial-*`` folder beside the target and renames it into
place when complete; a replaced graph is first renamed to ``.NAME.old-*`` and removed last.
A save that was killed leaves those folders behind. The next save to the same target, or a
load that finds the target missing, finishes or cleans up what its owner process, now gone,
left (`recover`): a complete new graph is moved into place, an incomplete one removed.
"""

from __future__ import annotations

import contextlib
import glob
import json
import mmap
import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import IO, Optional

import numpy as np

from jgrind.datasets.errors import DatasetError, npy_problem, require_file
from jgrind.datasets.npz import read_npy_header
from jgrind.graph import Graph
from jgrind.hostio.owner_locks import held_by_another, lock

FORMAT = "jgrind-graph"
VERSION = 1
META = "graph.json"
ARRAYS = ("indptr", "indices", "features", "labels", "train_mask", "val_mask", "test_mask")
OPTIONAL = ("edge_weight", "edge_type")
# beyond the arrays' bytes: .npy headers and graph.json, with room to spare
_SLACK_BYTES = 1 << 20

_HINT = "save the graph again (jgrind.datasets.save_graph, or `jgrind convert`)"


def save_graph(graph: Graph, directory, *, overwrite: bool = False, adopt=()) -> Path:
    """Write ``graph`` to the folder ``directory`` (see the module docstring); returns it.

    The files are written into a hidden folder beside ``directory`` and renamed into place
    when complete, so an error (a full disk, an interrupt) leaves nothing half-written and
    an existing folder as it was. Free space is checked first. An existing ``directory`` is
    replaced only with ``overwrite`` and only if it is an empty folder or a saved graph:
    anything else in it is never deleted.

    ``adopt``: folders whose ``.npy`` files the save may *move* into the graph's folder
    instead of copying them, when an array is a memory map of a whole such file on the same
    disk (`jgrind convert` passes its scratch folder: the decompressed features are then
    not written a second time). The files are gone from there afterwards; if the save
    fails they are put back.
    """
    target = Path(directory).expanduser().absolute()
    if target.parent.is_dir():
        recover(target)
    state = check_target(target, overwrite)
    parent = target.parent
    arrays = {k: getattr(graph, k) for k in ARRAYS}
    arrays.update({k: getattr(graph, k) for k in OPTIONAL if getattr(graph, k) is not None})
    moved = {k: f for k, a in arrays.items()
             if (f := _adoptable(a, adopt, parent)) is not None}
    need = sum(int(a.nbytes) for k, a in arrays.items() if k not in moved) + _SLACK_BYTES
    free = shutil.disk_usage(parent).free
    if need > free:
        raise DatasetError(f"cannot save the graph to {target}: it needs {_gib(need)} and the "
                           f"disk holding {parent} has {_gib(free)} free; free some space or "
                           "choose a folder on another disk")
    # renames within one folder are atomic (POSIX): the target is whole or absent
    partial = parent / hidden_name(target.name, "partial", uuid.uuid4().hex[:8])
    old = parent / hidden_name(target.name, "old", uuid.uuid4().hex[:8])
    owners = contextlib.ExitStack()  # the owner files' locks, held until the save ends
    try:
        partial.mkdir()
        owners.enter_context(mark_owner(partial))
        for key, a in arrays.items():
            if key in moved:  # its map stays valid: the file is renamed, not rewritten
                with open(moved[key], "rb+") as fh:
                    os.fsync(fh.fileno())  # what was written through the map, on disk
                moved[key].rename(partial / f"{key}.npy")
                continue
            with open(partial / f"{key}.npy", "wb") as fh:
                np.save(fh, a, allow_pickle=False)
                fh.flush()
                os.fsync(fh.fileno())  # on disk before the rename makes the folder visible
        meta = {"format": FORMAT, "version": VERSION, "name": graph.name,
                "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                "num_features": graph.num_features, "num_classes": graph.num_classes,
                "num_splits": graph.num_splits,
                "arrays": {k: {"dtype": a.dtype.str, "shape": list(a.shape)}
                           for k, a in arrays.items()}}
        if graph.relations:
            meta["relations"] = list(graph.relations)
        if graph.node_types:
            meta["node_types"] = [[t, c] for t, c in graph.node_types]
        # written whole or not at all: `recover` takes a folder with it for a finished save
        (partial / f"{META}.tmp").write_text(json.dumps(meta, indent=2) + "\n")
        (partial / f"{META}.tmp").rename(partial / META)
        if state == "empty":
            target.rmdir()
        elif state == "replace":  # the old folder goes only once the new one is complete
            # it moves with the folder: killed from here on, `recover` finishes the save
            owners.enter_context(mark_owner(target))
            target.rename(old)
        partial.rename(target)
        (target / OWNER).unlink()  # not part of the saved graph
    except BaseException as e:
        # the old graph back first: killed during what follows, no complete graph is lost
        if old.exists() and not target.exists():
            old.rename(target)
        (partial / META).unlink(missing_ok=True)  # `recover` must not take it for finished
        for key, source in moved.items():  # an adopted file goes back where it was
            if (partial / f"{key}.npy").exists() and not source.exists():
                (partial / f"{key}.npy").rename(source)
        shutil.rmtree(partial, ignore_errors=True)
        if target.is_dir():
            (target / OWNER).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise DatasetError(f"cannot save the graph to {target}: {e}; nothing was "
                               "written there") from e
        raise
    finally:
        owners.close()
    shutil.rmtree(old, ignore_errors=True)
    return target


OWNER = "owner"  # "host pid" of the process writing a hidden working folder


def mark_owner(folder: Path) -> IO:
    """Record this process (host and pid) as the owner of the working folder ``folder``, so
    that `recover` and `sweep_abandoned` can tell, after a crash, that nobody is using it
    any more. Returns the owner file, open and locked (`jgrind.hostio.owner_locks`: what shows a
    live owner whose pid means nothing here, in another container): keep it open while the
    folder is in use (it is a context manager). Renaming the folder keeps the lock."""
    fh = open(Path(folder) / OWNER, "w", encoding="ascii")
    try:
        lock(fh, wait=True)  # before the pid is written: never a readable owner without its lock
        fh.write(f"{socket.gethostname()} {os.getpid()}\n")
        fh.flush()
    except BaseException:
        fh.close()
        raise
    return fh


def sweep_abandoned(target, kind: str) -> list[Path]:
    """Remove the working folders of ``kind`` beside ``target`` (`leftovers`) whose owner
    (`mark_owner`) was a process on this host that no longer runs: what a killed convert
    left behind (its decompressed features can be tens of GB). A folder without an owner
    file, or another host's, or a live process's, is left alone. Returns those removed."""
    removed = []
    for folder in leftovers(Path(target).expanduser().absolute(), kind):
        if _owner_gone(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _owner_gone(folder: Path) -> bool:
    """Whether ``folder``'s owner (`mark_owner`) was a process on this host that no longer
    runs: no process has its pid, and none holds its owner file's lock. False without an
    owner file, for another host's, or a live (or reused) pid."""
    try:
        host, pid = (folder / OWNER).read_text().split()
        if host != socket.gethostname():
            return False
        os.kill(int(pid), 0)  # raises if no such process
        return False
    except ProcessLookupError:
        return not held_by_another(folder / OWNER)
    except (OSError, ValueError):
        return False


def hidden_name(name: str, kind: str, tag: str) -> str:
    """The hidden working folder ``.NAME.KIND-TAG`` of a save or convert to ``NAME``."""
    return f".{name}.{kind}-{tag}"


def leftovers(target: Path, kind: str) -> list[Path]:
    """The working folders of ``kind`` beside ``target`` (`hidden_name`, an 8-hex-digit tag):
    the name is matched literally, and another target's (``g.old-1`` beside ``g``) never."""
    pattern = hidden_name(glob.escape(target.name), kind, "?" * 8)
    return [p for p in sorted(target.parent.glob(pattern))
            if p.is_dir() and all(c in "0123456789abcdef" for c in p.name[-8:])]


def recover(target) -> Optional[Path]:
    """Finish or clean up what a killed `save_graph` to ``target`` left; returns the folder
    moved into place, if any. Only folders whose owner process is gone (`mark_owner`) are
    touched: a live process's, another host's or an unmarked folder is left alone.

    * No ``target``: a save killed after writing everything, before its renames finished,
      left its finished graph in ``.NAME.partial-*`` (a folder that loads); it is moved into
      place, the newest if several. Without one, the graph it was replacing
      (``.NAME.old-*``) is moved back.
    * A stray owner file in ``target`` is removed.
    * A partial folder that does not load (a save killed while writing) is removed.
    * Once ``target`` is a saved graph, the remaining partial and old folders are removed.
      Anything else at ``target`` (an empty folder, a file) leaves those where they are.
    """
    target = Path(target).expanduser().absolute()
    restored = None
    partials = [p for p in leftovers(target, "partial") if _owner_gone(p)]
    olds = [p for p in leftovers(target, "old") if _owner_gone(p)]
    finished = [p for p in partials if _loads(p)]
    for folder in partials:  # a save killed while writing: nothing whole in it
        if folder not in finished:
            shutil.rmtree(folder, ignore_errors=True)
    partials = finished
    if not target.exists():
        candidates = finished or olds  # a new graph that is whole, else the one it replaced
        if candidates:
            restored = max(candidates, key=lambda p: (p / META).stat().st_mtime
                           if (p / META).exists() else p.stat().st_mtime)
            try:
                restored.rename(target)
            except OSError as e:
                if not target.exists():  # not another process that recovered it first
                    raise DatasetError(f"cannot move {restored} into place as {target}: {e}; "
                                       "move it there by hand") from e
                return None
    if (target / META).is_file():
        if _owner_gone(target):
            (target / OWNER).unlink(missing_ok=True)
        for folder in partials + olds:
            if folder != restored:
                shutil.rmtree(folder, ignore_errors=True)
    return restored


def _loads(folder: Path) -> bool:
    """Whether ``folder`` holds a whole saved graph (every file as ``graph.json`` says)."""
    if not (folder / META).is_file():
        return False
    try:
        load_saved(folder)
        return True
    except DatasetError:
        return False


def _adoptable(a: np.ndarray, folders, parent: Path) -> Optional[Path]:
    """The ``.npy`` file in one of ``folders`` that ``a`` maps whole (every element, from
    the first, in C order, the file's own dtype and shape) on ``parent``'s disk, else None."""
    if not folders:
        return None
    base = a
    while not isinstance(base, np.memmap) and isinstance(base.base, np.ndarray):
        base = base.base
    name = getattr(base, "filename", None)
    if name is None or not a.flags.c_contiguous:
        return None
    path = Path(name)
    if path.suffix != ".npy" or not any(path.parent == Path(f).expanduser().absolute()
                                        for f in folders):
        return None
    try:
        with open(path, "rb") as fh:
            shape, fortran, dtype = read_npy_header(fh)
            header = fh.tell()
        same_disk = path.stat().st_dev == parent.stat().st_dev
    except (OSError, ValueError):
        return None
    whole = (base.offset == header and tuple(shape) == a.shape and dtype == a.dtype
             and not fortran and a.ctypes.data == base.ctypes.data
             and path.stat().st_size == header + a.nbytes)
    return path if whole and same_disk else None


def check_target(target, overwrite: bool = False) -> str:
    """Whether `save_graph` may write to the folder ``target``: ``"absent"``, ``"empty"`` (an
    empty folder) or ``"replace"`` (a saved graph, with ``overwrite``); raises `DatasetError`
    if it may not. Changes nothing (callers check before loading a large graph)."""
    target = Path(target).expanduser().absolute()
    if not target.parent.is_dir():
        raise DatasetError(f"cannot save the graph to {target}: its parent folder "
                           f"{target.parent} does not exist; create it first")
    if not target.exists():
        return "absent"
    if not target.is_dir():
        raise DatasetError(f"cannot save the graph to {target}: it is a file; choose a "
                           "folder name")
    if not any(target.iterdir()):
        return "empty"
    if not (target / META).is_file():  # checked first: --overwrite would not help
        raise DatasetError(f"will not write into {target}: it is not a saved graph (no "
                           f"{META}) and is not empty; choose a new folder")
    if not overwrite:
        raise DatasetError(f"cannot save the graph to {target}: it holds a saved graph; pass "
                           "overwrite=True (`jgrind convert --overwrite`) to replace it, or "
                           "choose a new folder")
    return "replace"


def load_saved(directory, *, mmap: bool = True, name=None) -> Graph:
    """The graph saved in ``directory`` by `save_graph`. With ``mmap`` (the default) every
    array is a read-only memory map of its file; without, the arrays are read into memory.
    Raises `DatasetError` naming the file for a missing folder or file, a folder that is not
    a saved graph, or a file whose dtype or shape differs from ``graph.json`` (replaced or
    truncated since it was saved)."""
    folder = Path(directory).expanduser()
    if not folder.exists() and folder.absolute().parent.is_dir():
        recover(folder)  # a save killed between its renames: its complete graph
    if not folder.is_dir():
        problem = "is a file, not a folder" if folder.exists() else "does not exist"
        raise DatasetError(f"saved graph folder {folder} {problem}; write one with "
                           "jgrind.datasets.save_graph or `jgrind convert`")
    meta = _read_meta(require_file(folder / META, "saved graph description",
                                   f"{folder} is not a saved graph; {_HINT}"))
    specs = meta["arrays"]
    arrays = {k: _read_array(folder / f"{k}.npy", specs[k], mmap)
              for k in (*ARRAYS, *OPTIONAL) if k in specs}
    return Graph(**arrays, num_classes=meta["num_classes"],
                 relations=tuple(meta.get("relations", ())),
                 node_types=tuple(tuple(t) for t in meta.get("node_types", ())),
                 name=name if name is not None else meta["name"])


def _read_meta(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"cannot read {path}: {e}; {_HINT}") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DatasetError(f"{path} does not describe a saved graph (its format is "
                           f"{meta.get('format') if isinstance(meta, dict) else None!r}, "
                           f"expected {FORMAT!r}); {_HINT}")
    if meta.get("version") != VERSION:
        raise DatasetError(f"{path} is version {meta.get('version')} of the saved graph "
                           f"format; this jgrind reads version {VERSION}; {_HINT} with this "
                           "jgrind")
    arrays = meta.get("arrays")
    missing = [k for k in ARRAYS if not isinstance(arrays, dict) or k not in arrays]
    if missing or not isinstance(meta.get("num_classes"), int):
        raise DatasetError(f"{path} is incomplete (no entry for "
                           f"{', '.join(missing) or 'num_classes'}); {_HINT}")
    for key, spec in arrays.items():
        if not _valid_spec(spec):
            raise DatasetError(f"{path}: the entry for {key} ({spec!r}) is not a dtype and a "
                               f"shape; {_HINT}")
    return meta


def _valid_spec(spec) -> bool:
    """Whether an array's entry in ``graph.json`` is ``{"dtype": ..., "shape": [ints]}``."""
    if not isinstance(spec, dict) or not isinstance(spec.get("shape"), list) \
            or not all(isinstance(d, int) and d >= 0 for d in spec["shape"]):
        return False
    try:
        np.dtype(spec.get("dtype"))
    except TypeError:
        return False
    return isinstance(spec.get("dtype"), str)


def _read_array(path: Path, spec: dict, mmap: bool) -> np.ndarray:
    require_file(path, "saved graph file", _HINT)
    try:
        a = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise DatasetError(f"cannot read {path}: {npy_problem(path, e)}; {_HINT}") from e
    if not isinstance(a, np.ndarray):  # np.load opens an .npz under any name
        a.close()
        raise DatasetError(f"cannot read {path}: it is an .npz archive, not a .npy array; "
                           f"{_HINT}")
    expected = (np.dtype(spec["dtype"]), tuple(spec["shape"]))
    if (a.dtype, a.shape) != expected:
        raise DatasetError(f"{path} holds {a.dtype.name} {list(a.shape)} but {META} says "
                           f"{expected[0].name} {list(expected[1])}: the file was replaced after "
                           f"the graph was saved; {_HINT}")
    return a


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def is_memory_mapped(a: np.ndarray) -> bool:
    """Whether ``a`` is a view of a memory-mapped file (as `load_saved` returns arrays)."""
    while a is not None:
        if isinstance(a, np.memmap):
            return True
        base = getattr(a, "base", None)
        if base is not None and not isinstance(base, np.ndarray):
            return isinstance(base, mmap.mmap)
        a = base
    return False


