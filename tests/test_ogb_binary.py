"""OGB's binary layout (ogbn-papers100M: ``raw/data.npz``), read a slice at a time: ``.npz``
members mapped in place or decompressed piecewise (`jgrind.datasets.npz`), and the CSR built in
two passes over the edges (`jgrind.datasets.csr`). The text layout of the same data is the
reference: both must give the same graph, bit for bit."""

import os
import sys
import tracemalloc
import zipfile

import numpy as np
import pytest

import jgrind.datasets as D
from jgrind.cli import main
from jgrind.datasets import npz
from jgrind.datasets.csr import csr_from_edge_chunks
from jgrind.datasets.stored import is_memory_mapped
from jgrind.graph import from_edges
from jgrind.transforms import make_undirected
from test_datasets import _tiny_ogb

SAVES = {"stored": np.savez, "compressed": np.savez_compressed}


def _binary_twin(text_dir, save, where="binary", **extra):
    """The OGB download at ``text_dir`` rewritten in the binary layout, in a folder of the
    same name under ``where`` beside it."""
    from jgrind.datasets.edgelist import read_text_table
    raw = text_dir / "raw"
    edges = read_text_table(raw / "edge.csv.gz", ncols=2, delimiter=",").astype(np.int64)
    feats = read_text_table(raw / "node-feat.csv.gz", dtype=np.float32, delimiter=",")
    labels = read_text_table(raw / "node-label.csv.gz", dtype=np.float64, delimiter=",")
    d = text_dir.parent / where / text_dir.name
    (d / "raw").mkdir(parents=True)
    (d / "split").symlink_to(text_dir / "split")
    arrays = dict(edge_index=edges.T.copy(), node_feat=feats,
                  num_nodes_list=np.array([len(feats)]), num_edges_list=np.array([len(edges)]),
                  node_year=np.zeros((len(feats), 1), np.int64))
    save(d / "raw/data.npz", **{**arrays, **extra})
    save(d / "raw/node-label.npz", node_label=labels)
    return d


def _same_graph(a, b):
    assert (a.name, a.num_classes) == (b.name, b.num_classes)
    for field in ("indptr", "indices", "features", "labels", "train_mask", "val_mask",
                  "test_mask"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and np.array_equal(x, y), field


@pytest.mark.parametrize("kind", SAVES)
@pytest.mark.parametrize("name", ["ogbn_papers100M", "ogbn_products"])
def test_binary_layout_gives_the_text_layouts_graph(tmp_path, kind, name):
    text, *_ = _tiny_ogb(tmp_path, name=name)
    binary = _binary_twin(text, SAVES[kind])
    # products is made undirected (OGB's add_inverse_edge), papers100M kept as stored
    _same_graph(D.load(f"ogb:{binary}"), D.load(f"ogb:{text}"))
    _same_graph(D.load_ogb_raw(binary, to_undirected=True),
                D.load_ogb_raw(text, to_undirected=True))


def test_stored_features_are_mapped_where_they_lie(tmp_path):
    text, *_ = _tiny_ogb(tmp_path, name="ogbn_papers100M")
    g = D.load(f"ogb:{_binary_twin(text, np.savez)}")
    assert is_memory_mapped(g.features)
    assert str(np.asarray(g.features).base.filename).endswith("data.npz")


def test_compressed_features_go_to_scratch_not_memory(tmp_path):
    text, _, _, feats, *_ = _tiny_ogb(tmp_path, name="ogbn_papers100M")
    binary = _binary_twin(text, np.savez_compressed)
    assert not is_memory_mapped(D.load(f"ogb:{binary}").features)  # decompressed into memory
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    g = D.load(f"ogb:{binary}", scratch=scratch)
    [file] = scratch.iterdir()
    assert is_memory_mapped(g.features) and file.name.startswith("node_feat-")
    np.testing.assert_array_equal(np.load(file), feats)
    # a second graph in the same folder gets a file of its own: the first one's stays as it was
    other = _binary_twin(text, np.savez_compressed, where="other", node_feat=feats + 1)
    np.testing.assert_array_equal(D.load(f"ogb:{other}", scratch=scratch).features, feats + 1)
    np.testing.assert_array_equal(g.features, feats)
    assert len(list(scratch.iterdir())) == 2
    with pytest.raises(D.DatasetError, match="scratch folder .* does not exist"):
        D.load(f"ogb:{binary}", scratch=tmp_path / "none")


def test_features_are_decompressed_a_slice_at_a_time(tmp_path, monkeypatch):
    """8 MiB of compressed features, read in 256 KiB slices into a scratch file: the
    process's own memory never holds more than a few slices (into memory: all 8 MiB)."""
    rng = np.random.default_rng(3)
    n = 1 << 15
    feats = rng.standard_normal((n, 64), np.float32)
    np.savez_compressed(tmp_path / "f.npz", node_feat=feats)
    member = npz.members(tmp_path / "f.npz", "hint")["node_feat"]
    monkeypatch.setattr(npz, "CHUNK_BYTES", 256 << 10)
    out = np.lib.format.open_memmap(tmp_path / "out.npy", mode="w+", dtype=np.float32,
                                    shape=feats.shape)
    peaks = []
    for target in (out, None):
        tracemalloc.start()
        try:
            got = npz.read_array(member, out=target)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        np.testing.assert_array_equal(got, feats)
    assert peaks[0] < 2 << 20 < feats.nbytes <= peaks[1], [p / 2**20 for p in peaks]


def test_fortran_order_arrays_arrive_in_c_order(tmp_path):
    text, _, _, feats, *_ = _tiny_ogb(tmp_path, name="ogbn_papers100M")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for kind, save in SAVES.items():
        d = _binary_twin(text, save, where=kind, node_feat=np.asfortranarray(feats))
        for options in ({}, {"scratch": scratch}):
            g = D.load(f"ogb:{d}", **options)
            assert g.features.flags.c_contiguous
            np.testing.assert_array_equal(g.features, feats)
        member = npz.members(d / "raw/data.npz", "hint")["node_feat"]
        for chunk in (4, 12, 1000):  # slices that end mid-column
            np.testing.assert_array_equal(npz.read_array(member, chunk_bytes=chunk), feats)


def test_half_precision_features_arrive_as_float32(tmp_path):
    text, _, _, feats, *_ = _tiny_ogb(tmp_path, name="ogbn_papers100M")
    d = _binary_twin(text, np.savez, node_feat=feats.astype(np.float16))
    g = D.load(f"ogb:{d}")
    assert g.features.dtype == np.float32
    np.testing.assert_array_equal(g.features, feats.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("kind", SAVES)
@pytest.mark.parametrize("layout", ["2E", "2E-fortran", "E2", "E2-fortran"])
def test_csr_from_slices_is_from_edges_bit_for_bit(tmp_path, kind, layout):
    """Every slice size, every way an edge list can lie in an archive: the same row pointers
    and each row's sources in file order, as the one-shot sort of `from_edges` gives."""
    rng = np.random.default_rng(1)
    n, e = 40, 1000
    edges = rng.integers(0, n, (2, e))
    edges[:, :50] = edges[:, :1]  # a run of one repeated edge across slice borders
    ref = from_edges(edges[0], edges[1], np.zeros((n, 1)), np.zeros(n, int))
    stored = {"2E": edges, "2E-fortran": np.asfortranarray(edges), "E2": edges.T.copy(),
              "E2-fortran": np.asfortranarray(edges.T)}[layout]
    SAVES[kind](tmp_path / "e.npz", edge_index=stored)
    member = npz.members(tmp_path / "e.npz", "hint")["edge_index"]
    assert member.compressed == (kind == "compressed")
    for chunk in (1, 3, 64, e, 4 * e):
        indptr, indices = csr_from_edge_chunks(npz.edge_chunks(member, chunk_edges=chunk), n,
                                               what="e", hint="hint")
        assert indptr.dtype == ref.indptr.dtype and indices.dtype == ref.indices.dtype
        np.testing.assert_array_equal(indptr, ref.indptr)
        np.testing.assert_array_equal(indices, ref.indices)


@pytest.mark.parametrize("kind", SAVES)
def test_symmetric_csr_is_make_undirected_bit_for_bit(tmp_path, kind):
    """Both directions placed, then rows sorted and deduplicated a block at a time: the graph
    `make_undirected` gives, with self loops, repeated edges and reciprocal pairs, for blocks
    of one row up to the whole graph."""
    rng = np.random.default_rng(4)
    for n, e in ((30, 400), (200, 60)):  # dense rows; mostly empty ones
        edges = rng.integers(0, n, (2, e))
        edges[:, :5] = [[3], [3]]  # a self loop, five times
        edges[:, 5:9] = [[1, 2, 2, 7], [2, 1, 1, 7]]  # a pair stored both ways, and again
        edges[:, -1] = [n - 1, 0]
        ref = make_undirected(from_edges(edges[0], edges[1], np.zeros((n, 1)),
                                         np.zeros(n, int)))
        SAVES[kind](tmp_path / "e.npz", edge_index=edges)
        member = npz.members(tmp_path / "e.npz", "hint")["edge_index"]
        for chunk, block in ((1, 1), (7, 5), (64, 100), (e, 10 * e)):
            indptr, indices = csr_from_edge_chunks(npz.edge_chunks(member, chunk_edges=chunk),
                                                   n, what="e", hint="hint", symmetric=True,
                                                   block_edges=block)
            for got, want in ((indptr, ref.indptr), (indices, ref.indices)):
                assert got.dtype == want.dtype
                np.testing.assert_array_equal(got, want)


def test_csr_memory_grows_with_the_nodes_not_the_edges(tmp_path):
    """The edge list is 16 MiB of int64; the result is 4 MiB of int32 indices. Read in slices
    of 64K edges, the build never holds the edge list: its peak (10.7 MiB when written) stays
    below the edge list's own size (`np.load` + `from_edges` peaked at 36 MiB here)."""
    rng = np.random.default_rng(2)
    n, e = 1000, 1 << 20
    np.savez_compressed(tmp_path / "e.npz", edge_index=rng.integers(0, n, (2, e)))
    member = npz.members(tmp_path / "e.npz", "hint")["edge_index"]
    tracemalloc.start()
    try:
        indptr, indices = csr_from_edge_chunks(npz.edge_chunks(member, chunk_edges=1 << 16), n,
                                               what="e", hint="hint")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert indices.nbytes == 4 * e and int(indptr[-1]) == e
    assert peak < indices.nbytes + (8 << 20) < 16 << 20, f"peak {peak / 2**20:.1f} MiB"


def test_symmetric_csr_memory_is_the_placed_edges_and_a_block(tmp_path):
    """Undirected: both directions placed (8 MiB of int32 for 1M edges), then sorted a block
    of 64K at a time. Its peak (16.3 MiB when written) stays far below symmetrising in memory
    (`np.load` + `from_edges` + `make_undirected`: 82.8 MiB on this graph)."""
    rng = np.random.default_rng(5)
    n, e = 1 << 17, 1 << 20
    np.savez_compressed(tmp_path / "e.npz", edge_index=rng.integers(0, n, (2, e)))
    member = npz.members(tmp_path / "e.npz", "hint")["edge_index"]
    tracemalloc.start()
    try:
        indptr, indices = csr_from_edge_chunks(npz.edge_chunks(member, chunk_edges=1 << 16), n,
                                               what="e", hint="hint", symmetric=True,
                                               block_edges=1 << 16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert indices.dtype == np.int32 and int(indptr[-1]) == indices.size > e
    assert peak < 8 * e + (10 << 20), f"peak {peak / 2**20:.1f} MiB"


def test_bad_binary_downloads_are_named(tmp_path):
    text, *_ = _tiny_ogb(tmp_path, name="ogbn_papers100M")
    d = _binary_twin(text, np.savez_compressed)
    raw = d / "raw"
    good = (raw / "data.npz").read_bytes()
    with pytest.raises(D.DatasetError, match="node_features=.*binary one"):
        D.load_ogb_raw(d, node_features="edge_mean")

    (raw / "data.npz").write_bytes(good[: len(good) // 2])  # a download cut short
    with pytest.raises(D.DatasetError, match=r"cannot read .*data\.npz: file is truncated"):
        D.load(f"ogb:{d}")

    (raw / "data.npz").write_bytes(good)
    with zipfile.ZipFile(raw / "data.npz") as archive:
        info = archive.getinfo("edge_index.npy")
    middle = info.header_offset + 30 + len(info.filename) + info.compress_size // 2
    damaged = bytearray(good)
    damaged[middle:middle + 64] = bytes(64)  # bits flipped inside the edges' deflate stream
    (raw / "data.npz").write_bytes(bytes(damaged))
    with pytest.raises(D.DatasetError, match="damaged.*edge_index|edge_index.*damaged"):
        D.load(f"ogb:{d}")

    feats = np.zeros((50, 4), np.float32)
    np.savez(raw / "data.npz", node_feat=feats)
    with pytest.raises(D.DatasetError, match="lacks the key.*edge_index.*it has node_feat"):
        D.load(f"ogb:{d}")
    np.savez(raw / "data.npz", node_feat=feats, edge_index=np.array([[0, 1], [2, 50]]))
    with pytest.raises(D.DatasetError, match="edge 1 has destination 50, out of range for 50"):
        D.load(f"ogb:{d}")
    np.savez(raw / "data.npz", node_feat=feats, edge_index=np.zeros((3, 4), int))
    with pytest.raises(D.DatasetError, match=r"shape \(3, 4\), expected \[2, E\]"):
        D.load(f"ogb:{d}")
    np.savez(raw / "data.npz", node_feat=feats, edge_index=np.zeros((2, 4), int),
             num_nodes_list=np.array([20, 30]))
    with pytest.raises(D.DatasetError, match="lists 2 graphs"):
        D.load(f"ogb:{d}")
    np.savez(raw / "data.npz", node_feat=feats, edge_index=np.zeros((2, 4), int))
    np.savez(raw / "node-label.npz", node_label=np.zeros((49, 1)))
    with pytest.raises(D.DatasetError, match=r"node_label has shape \(49, 1\)"):
        D.load(f"ogb:{d}")
    np.savez(raw / "node-label.npz", node_label=np.array([None] * 50, dtype=object))
    with pytest.raises(D.DatasetError, match="holds Python objects"):
        D.load(f"ogb:{d}")
    np.savez(raw / "node-label.npz", node_label=np.array(["a"] * 50))
    with pytest.raises(D.DatasetError, match="node_label holds <U1 values, not numbers"):
        D.load(f"ogb:{d}")
    np.savez(raw / "node-label.npz", node_label=np.zeros(50))
    np.savez(raw / "data.npz", node_feat=feats, edge_index=np.zeros((2, 4), int),
             num_nodes_list=np.array([60]))
    with pytest.raises(D.DatasetError, match="num_nodes_list says 60 nodes but node_feat has 50"):
        D.load(f"ogb:{d}")


def test_a_stored_member_shorter_than_its_header_is_refused(tmp_path):
    """A stored member is mapped, not read: one whose header promises more than the entry
    holds would map the next entry's bytes, so it is refused when the archive is opened."""
    import io
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False,
                                                  "shape": (99,)})
    path = tmp_path / "a.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("a.npy", header.getvalue() + np.arange(10).tobytes())
        archive.writestr("b.npy", header.getvalue() + np.arange(99).tobytes())
    with pytest.raises(D.DatasetError, match="a.npy holds 80 bytes of data, and its header "
                                             r"promises \(99,\)"):
        npz.members(path, "hint")


def test_convert_decompresses_beside_the_output_and_cleans_up(tmp_path, capsys, monkeypatch):
    import jgrind.config
    text, *_ = _tiny_ogb(tmp_path, name="ogbn_papers100M")
    d = _binary_twin(text, np.savez_compressed)
    out = tmp_path / "saved"
    scratches, load_graph = [], jgrind.config.load_graph

    def spy(cfg, **options):  # the scratch folder convert passes, and what is in it then
        graph = load_graph(cfg, **options)
        scratches.extend((p.name, p.stat().st_ino) for p in options["scratch"].iterdir()
                         if p.name != "owner")
        return graph
    monkeypatch.setattr(jgrind.config, "load_graph", spy)
    assert main(["convert", "--dataset", f"ogb:{d}", "--out", str(out)]) == 0
    [(name, inode)] = scratches
    assert name.startswith("node_feat-")
    assert (out / "features.npy").stat().st_ino == inode  # moved into place, not written again
    mode = lambda name: (out / name).stat().st_mode & 0o777  # noqa: E731
    assert mode("features.npy") == mode("indptr.npy")  # readable as any file np.save writes
    _same_graph(D.load(f"npy:{out}"), D.load(f"ogb:{text}"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["binary", "ogbn_papers100M", "saved"]
    # a NaN feature is found once the features are decompressed into the scratch folder
    feats = np.load(out / "features.npy")
    feats[3, 1] = np.nan
    d = _binary_twin(text, np.savez_compressed, where="nan", node_feat=feats)
    assert main(["convert", "--dataset", f"ogb:{d}", "--out", str(tmp_path / "b")]) == 2
    assert "NaN" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["binary", "nan", "ogbn_papers100M",
                                                          "saved"]
    # an --out whose parent is missing fails before anything is read
    monkeypatch.setattr(jgrind.config, "load_graph", None)
    assert main(["convert", "--dataset", f"ogb:{d}", "--out", str(tmp_path / "no/out")]) == 2
    assert "parent folder" in capsys.readouterr().err


def test_convert_sweeps_scratch_folders_that_a_killed_convert_left(tmp_path, capsys):
    """A convert killed with SIGKILL leaves its scratch folder (features decompressed, tens
    of GB on papers100M). The next convert to the same --out removes it when its owner
    process is gone; a live owner's, another host's or an unmarked folder stays."""
    import socket
    import subprocess
    text, *_ = _tiny_ogb(tmp_path, name="ogbn_papers100M")
    d = _binary_twin(text, np.savez_compressed)
    out = tmp_path / "saved"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    # tags as the convert makes them, 8 hex digits: dead, alive, elsewhere, unmarked
    owners = {"dead0000": f"{host} {gone.pid}", "a11be000": f"{host} {os.getpid()}",
              "e15e0000": f"another-{host} {gone.pid}", "0000beef": None}
    for key, owner in owners.items():
        folder = tmp_path / f".saved.scratch-{key}"
        folder.mkdir()
        (folder / "node_feat-x.npy").write_bytes(b"0" * 64)
        if owner is not None:
            (folder / "owner").write_text(owner + "\n")
    assert main(["convert", "--dataset", f"ogb:{d}", "--out", str(out)]) == 0
    left = sorted(p.name for p in tmp_path.iterdir() if ".scratch-" in p.name)
    assert left == [".saved.scratch-0000beef", ".saved.scratch-a11be000",
                    ".saved.scratch-e15e0000"]
    assert "scratch-dead0000: left by a convert that did not finish" in capsys.readouterr().out
