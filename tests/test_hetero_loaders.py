"""Heterogeneous loaders: the HGSL pickles (real DBLP, and a hostile pickle), OGB's
heterogeneous raw layout (a small folder written here), the ogbn-mag-sized generator (small)."""

import gzip
import os
import pickle

import numpy as np
import pytest
import scipy.sparse as sp

import jgrind.datasets as D
from jgrind.datasets.generated_hetero import NODE_TYPES, RELATIONS, mag_like
from jgrind.datasets.hgsl import FILES, read_hgsl, read_pickle
from jgrind.graph import GraphError

DBLP = [f"hgsl/dblp/{f}" for f in FILES]
DBLP_RELATIONS = ("p__p-a__a", "a__a-p__p", "p__p-c__c", "c__c-p__p")


def in_edges(g, node):
    lo, hi = g.indptr[node], g.indptr[node + 1]
    return {(int(s), g.relations[t]) for s, t in zip(g.indices[lo:hi], g.edge_type[lo:hi])}


# -- HGSL / GTN pickles ------------------------------------------------------------------------
def test_dblp_types_split_and_known_edges(data_file):
    data_file(*DBLP)
    g = D.load("dblp")
    assert g.node_types == (("a", 2957), ("p", 4328), ("c", 20))
    assert g.num_nodes == 7305 and g.num_edges == 2 * (5580 + 4328)
    assert g.relations == DBLP_RELATIONS  # both directions stored: no inverse added
    assert np.bincount(g.edge_type).tolist() == [5580, 5580, 4328, 4328]
    assert (g.train_mask.sum(), g.val_mask.sum(), g.test_mask.sum()) == (600, 300, 2057)
    assert not g.train_mask[:, 2957:].any() and g.labels[2957:].max() == -1
    assert g.num_classes == 4
    # edges as the files list them (row node -> column node), in the files' global ids
    assert (2957, "p__p-a__a") in in_edges(g, 2200)  # paper 2957 -> author 2200
    assert (0, "a__a-p__p") in in_edges(g, 4661)  # author 0 -> paper 4661
    assert (2957, "p__p-c__c") in in_edges(g, 7291)  # paper 2957 -> conference 7291
    assert (7285, "c__c-p__p") in in_edges(g, 4783)  # conference 7285 -> paper 4783
    assert (2200, "a__a-p__p") in in_edges(g, 2957)  # and the reverse of the first
    # labels: (author 0, class 1) and (author 1, class 3) train; (author 600, class 2) val
    assert g.labels[[0, 1, 600]].tolist() == [1, 3, 2]
    assert g.train_mask[0, [0, 1]].all() and g.val_mask[0, 600]
    # every type keeps its rows of the one feature matrix
    assert g.num_features == 334
    assert np.flatnonzero(g.features[0]).tolist() == [10, 88, 133, 197]
    assert np.flatnonzero(g.features[7290])[:5].tolist() == [0, 1, 4, 5, 8]


def test_dblp_hetero_value_and_prefix(data_root, data_file):
    data_file(*DBLP)
    h = read_hgsl(data_root / "hgsl" / "dblp")
    assert h.target == "a" and h.count("p") == 4328
    assert h.with_inverses().relation_names() == DBLP_RELATIONS
    g = D.load(f"hgsl:{data_root / 'hgsl' / 'dblp'}", inverses=False)
    assert g.relations == DBLP_RELATIONS and g.name == "dblp"


class _Hostile:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_hostile_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "ran"
    folder = tmp_path / "evil"
    folder.mkdir()
    for f in FILES:
        with open(folder / f, "wb") as fh:
            pickle.dump({"t_info": _Hostile(marker)}, fh)
    with pytest.raises(D.DatasetError, match=r"refusing to load posix\.system|refusing to "
                                             r"load os\.system|refusing to load nt\.system") \
            as err:
        D.load(f"hgsl:{folder}")
    assert "\n" not in str(err.value)
    assert not marker.exists()


def test_a_pickle_naming_another_class_is_refused(tmp_path):
    path = tmp_path / "x.pkl"
    with open(path, "wb") as fh:
        pickle.dump({"a": np.ma.masked_array([1, 2])}, fh)  # NumPy, but not the format's
    with pytest.raises(D.DatasetError, match="refusing to load numpy.ma"):
        read_pickle(path)


def write_hgsl(folder, *, labels=None, edges=None):
    """A tiny HGSL folder: a 0..1, p 2..4, c 5; relations a-p and p-c."""
    folder.mkdir()
    n = 6
    a_p = sp.csr_matrix(([1.0, 1.0, 1.0], ([0, 1, 1], [2, 2, 4])), shape=(n, n))
    p_c = sp.csc_matrix(([1.0, 1.0, 1.0], ([2, 3, 4], [5, 5, 5])), shape=(n, n))
    meta = {"t_info": {"a": {"ind": range(0, 2), "cnt": 2}, "p": {"ind": range(2, 5), "cnt": 3},
                       "c": {"ind": range(5, 6), "cnt": 1}}, "n_class": 2, "types": ["a", "p", "c"]}
    parts = {"edges.pkl": edges if edges is not None else {"a-p": a_p, "p-c": p_c},
             "labels.pkl": labels if labels is not None else
             [np.array([[2, 0]]), np.array([[3, 1]]), np.array([[4, 1]])],
             "node_features.pkl": sp.csr_matrix(np.arange(12.0).reshape(n, 2)),
             "meta_data.pkl": meta}
    for f, obj in parts.items():
        with open(folder / f, "wb") as fh:
            pickle.dump(obj, fh)
    return folder


def test_a_small_hgsl_folder_gets_inverses(tmp_path):
    g = D.load(f"hgsl:{write_hgsl(tmp_path / 'tiny')}")
    assert g.relations == ("a__a-p__p", "p__p-c__c", "p__rev_a-p__a", "c__rev_p-c__p")
    assert in_edges(g, 2) == {(0, "a__a-p__p"), (1, "a__a-p__p"), (5, "c__rev_p-c__p")}
    assert in_edges(g, 1) == {(2, "p__rev_a-p__a"), (4, "p__rev_a-p__a")}
    np.testing.assert_array_equal(g.labels, [-1, -1, 0, 1, 1, -1])
    np.testing.assert_array_equal(g.features[5], [10, 11])


@pytest.mark.parametrize("labels, edges, message", [
    ([np.array([[1, 0]]), np.array([[3, 1]]), np.array([[4, 1]])], None,
     "do not lie in one node type's range"),
    ([np.array([[2, 0]]), np.array([[2, 1]]), np.array([[4, 1]])], None, "listed twice"),
    (None, {"a-x": sp.csr_matrix(([1.0, 1.0], ([0, 0], [1, 2])), shape=(6, 6))},
     r"relation 'a-x' \(columns: destinations\): ids 1..2 do not lie"),
    (None, {"a-p": sp.csr_matrix((7, 7))}, r"expected a sparse \[6, 6\] matrix"),
])
def test_bad_hgsl_folders_are_one_clear_line(tmp_path, labels, edges, message):
    folder = write_hgsl(tmp_path / "bad", labels=labels, edges=edges)
    with pytest.raises(D.DatasetError, match=message) as err:
        D.load(f"hgsl:{folder}")
    assert "\n" not in str(err.value)


def test_edges_outside_the_stated_r_info_ranges_are_refused(tmp_path):
    folder = write_hgsl(tmp_path / "r_info")
    meta = read_pickle(folder / "meta_data.pkl")
    meta["r_info"] = {"a-p": (0, 2, 2, 5), "p-c": (2, 5, 0, 2)}  # p-c said to end at authors
    with open(folder / "meta_data.pkl", "wb") as fh:
        pickle.dump(meta, fh)
    with pytest.raises(D.DatasetError, match=r"relation 'p-c' joins p \(2, 5\) to c \(5, 6\), "
                                             r"but meta_data's r_info says \(2, 5, 0, 2\)"):
        D.load(f"hgsl:{folder}")


def test_a_missing_hgsl_file_is_named(tmp_path):
    folder = write_hgsl(tmp_path / "gone")
    (folder / "labels.pkl").unlink()
    with pytest.raises(D.DatasetError, match="labels.pkl does not exist"):
        D.load(f"hgsl:{folder}")


# -- OGB heterogeneous raw layout (ogbn-mag) ---------------------------------------------------
def write_gz(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(f"{line}\n" for line in lines))


def write_mag(root, *, cites=((0, 1), (2, 1), (1, 0))):
    """ogbn-mag's layout, tiny: 3 papers (features, labels), 2 authors, 1 institution."""
    raw = root / "raw"
    write_gz(raw / "num-node-dict.csv.gz", ["paper,author,institution", "3,2,1"])
    write_gz(raw / "triplet-type-list.csv.gz", ["author,writes,paper",
                                                "author,affiliated_with,institution",
                                                "paper,cites,paper"])
    rel = {"author___writes___paper": [(0, 0), (1, 0), (1, 2)],
           "author___affiliated_with___institution": [(0, 0), (1, 0)],
           "paper___cites___paper": list(cites)}
    for folder, edges in rel.items():
        write_gz(raw / "relations" / folder / "edge.csv.gz", [f"{s},{d}" for s, d in edges])
        write_gz(raw / "relations" / folder / "num-edge-list.csv.gz", [str(len(edges))])
        write_gz(raw / "relations" / folder / "edge_reltype.csv.gz", ["0"] * len(edges))
    write_gz(raw / "node-feat" / "paper" / "node-feat.csv.gz", ["1,2", "3,4", "5,6"])
    write_gz(raw / "node-feat" / "paper" / "node_year.csv.gz", ["2010", "2011", "2019"])
    write_gz(raw / "node-label" / "paper" / "node-label.csv.gz", ["0", "1", "1"])
    split = root / "split" / "time" / "paper"
    for part, ids in (("train", ["0"]), ("valid", ["1"]), ("test", ["2"])):
        write_gz(split / f"{part}.csv.gz", ids)
    return root


def test_ogb_hetero_folder_as_ogb_numbers_it(tmp_path):
    g = D.load(f"ogb:{write_mag(tmp_path / 'ogbn_mag')}")
    # types and relations sorted, as OGB's reader takes them
    assert g.node_types == (("author", 2), ("institution", 1), ("paper", 3))
    assert g.relations == ("author__affiliated_with__institution", "author__writes__paper",
                           "paper__cites__paper", "institution__rev_affiliated_with__author",
                           "paper__rev_writes__author", "paper__rev_cites__paper")
    # paper p is global 3 + p; author a is a; institution 2
    assert in_edges(g, 3) == {(0, "author__writes__paper"), (1, "author__writes__paper"),
                              (4, "paper__cites__paper"), (4, "paper__rev_cites__paper")}
    assert in_edges(g, 2) == {(0, "author__affiliated_with__institution"),
                              (1, "author__affiliated_with__institution")}
    assert in_edges(g, 1) == {(3, "paper__rev_writes__author"), (5, "paper__rev_writes__author"),
                              (2, "institution__rev_affiliated_with__author")}
    np.testing.assert_array_equal(g.labels, [-1, -1, -1, 0, 1, 1])
    np.testing.assert_array_equal(g.train_mask, [[0, 0, 0, 1, 0, 0]])
    np.testing.assert_array_equal(g.test_mask, [[0, 0, 0, 0, 0, 1]])
    np.testing.assert_array_equal(g.features[3:], [[1, 2], [3, 4], [5, 6]])
    # author 1 wrote papers 0 and 2: their mean; the institution: its authors' mean
    np.testing.assert_allclose(g.features[1], [3, 4])
    np.testing.assert_allclose(g.features[2], [(1 + 3) / 2, (2 + 4) / 2])
    plain = D.load(f"ogb:{tmp_path / 'ogbn_mag'}", inverses=False)
    assert plain.num_edges == 8 and len(plain.relations) == 3


def test_ogb_hetero_bad_input_is_one_clear_line(tmp_path):
    root = write_mag(tmp_path / "mag", cites=((0, 1), (3, 1)))
    with pytest.raises(D.DatasetError, match=r"id 3 is outside paper's ids \[0, 3\)") as err:
        D.load(f"ogb:{root}")
    assert "\n" not in str(err.value)
    root = write_mag(tmp_path / "mag2")
    with pytest.raises(D.DatasetError, match="to_undirected= does not apply"):
        D.load(f"ogb:{root}", to_undirected=True)
    with pytest.raises(D.DatasetError, match="no split folder"):
        D.load(f"ogb:{root}", split="random")
    write_gz(root / "raw" / "triplet-type-list.csv.gz", ["author,writes,book"])
    with pytest.raises(D.DatasetError, match="node type 'book'"):
        D.load(f"ogb:{root}")


def test_ogb_hetero_missing_labels_are_named(tmp_path):
    root = write_mag(tmp_path / "mag")
    (root / "raw" / "node-label" / "paper" / "node-label.csv.gz").unlink()
    (root / "raw" / "node-label" / "paper").rmdir()
    with pytest.raises(D.DatasetError, match="expected labels for one node type"):
        D.load(f"ogb:{root}")


# -- the ogbn-mag-sized generator ----------------------------------------------------------------
def test_mag_like_small_scale_sizes_and_determinism():
    h = mag_like(scale=0.002, seed=3)
    counts = dict(h.node_types)
    assert counts == {t: round(c * 0.002) for t, c in NODE_TYPES}
    for key, edges in RELATIONS:
        assert h.relations[key].num_edges == round(edges * 0.002), key
    cites = h.relations[("paper", "cites", "paper")]
    assert not np.any(cites.destinations() == cites.indices)  # no self loops
    assert h.features["paper"].shape == (counts["paper"], 128) and h.num_classes == 349
    again = mag_like(scale=0.002, seed=3)
    other = mag_like(scale=0.002, seed=4)
    for key, csr in h.relations.items():
        np.testing.assert_array_equal(csr.indices, again.relations[key].indices)
    assert not np.array_equal(cites.indices, other.relations[("paper", "cites", "paper")].indices)
    n = counts["paper"]
    assert h.train_mask.sum() == round(629_571 / 736_389 * n)


def test_mag_like_is_a_dataset_name():
    g = D.load("mag-like:0.001")
    assert len(g.relations) == 8 and g.relations[4] == "paper__rev_writes__author"
    assert g.node_types[0] == ("paper", 736)
    # every type gets features: papers their own, the others their in-neighbours' mean
    for lo, hi in ((736, 736 + 1135), (736 + 1135, 736 + 1135 + 9)):  # authors, institutions
        assert np.mean(np.abs(g.features[lo:hi]).sum(axis=1) > 0) > 0.5
    assert D.load("mag-like", scale=0.001).num_edges == g.num_edges
    assert "mag-like" in [r.name for r in D.available()]
    assert "dblp" in [r.name for r in D.available()]
    with pytest.raises(GraphError, match="scale must be a number"):
        D.load("mag-like", scale=0)
