"""The Python examples in README.md and docs/ run as written, at test size.

Each file's ```python blocks run in order in one namespace, so that a later block may use an
earlier one's names (as a reader would). Only sizes and paths are rewritten: epochs, trials and
node counts shrink, and the made-up store paths ("/mnt/nvme", "/tmp", "runs/plan") point into
the test's temporary directory. Names a page uses without defining them (``key``, ``graph``,
``model`` in docs/planner.md) come from a small prelude. A renamed function, a removed argument
or a changed return type in any example fails here, not in a reader's first session.
"""

import os
import pathlib
import re

import pytest

from jgrind.plan.profile import save
from test_datasets import planetoid_files
from test_planner import fixed_profile

ROOT = pathlib.Path(__file__).resolve().parents[1]

# (pattern, replacement) applied to every block: smaller runs, no real store paths
SHRINK = [
    (r"epochs=\d+", "epochs=2"),
    (r"seeds=range\(\d+\)", "seeds=range(2)"),
    (r"num_nodes=[\d_]+", "num_nodes=3_000"),
]

PRELUDE = """
import jax, optax, jgrind
key = jax.random.key(0)
graph = jgrind.datasets.load("rmat", num_nodes=2_000)
model = jgrind.models.gcn(graph.num_features, 16, graph.num_classes, num_layers=2)
"""


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def at_test_size(code: str, tmp: pathlib.Path) -> str:
    for pattern, replacement in SHRINK:
        code = re.sub(pattern, replacement, code)
    for path in ("/mnt/nvme", "/tmp", "runs/plan"):
        code = code.replace(f'"{path}"', repr(str(tmp / path.strip("/").replace("/", "-"))))
    return code


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A working directory and store paths under ``tmp_path``, and a saved hardware profile
    where ``auto()`` and ``load_or_measure()`` look (so no example measures the machine)."""
    for name in ("mnt-nvme", "tmp"):
        (tmp_path / name).mkdir()
    profile = tmp_path / "profile.json"
    save(fixed_profile(directory=str((tmp_path / "mnt-nvme").resolve())), profile)
    monkeypatch.setenv("JGRIND_PROFILE", str(profile))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_page(relpath: str, tmp: pathlib.Path, prelude: str = "") -> dict:
    blocks = python_blocks((ROOT / relpath).read_text())
    assert blocks, f"{relpath} has no python examples"
    namespace: dict = {"__name__": f"example:{relpath}"}
    exec(compile(prelude, "prelude", "exec"), namespace)
    for i, block in enumerate(blocks):
        exec(compile(at_test_size(block, tmp), f"{relpath}, example {i + 1}", "exec"),
             namespace)
    return namespace


def test_at_test_size_rewrites_only_sizes_and_paths(tmp_path):
    code = 'train(k, g, m, o, epochs=200, store="/mnt/nvme", seeds=range(10))'
    assert at_test_size(code, tmp_path) == (
        f"train(k, g, m, o, epochs=2, store={str(tmp_path / 'mnt-nvme')!r}, seeds=range(2))")


def test_readme_example(sandbox, data_file):
    data_file(*planetoid_files("cora"))  # the README's script trains on Cora
    names = run_page("README.md", sandbox)
    assert names["trials"].summary()
    assert callable(names["policy"])  # every step ran, down to the planner's run
    assert set(names) >= {"graph", "model", "optimizer", "result", "trials"}


def test_guide_examples(sandbox):
    names = run_page("docs/guide.md", sandbox)
    assert names["logits"].shape == (names["graph"].num_nodes, names["graph"].num_classes)
    assert names["best_params"] is not None  # the checkpoint was read back
    assert names["tasks"].labels.ndim == 2  # the multi-label example ran on [N, T] targets
    assert (sandbox / "my-graph" / "graph.json").exists()  # your own graph, saved


def test_engine_page_examples(sandbox):
    names = run_page("docs/engine.md", sandbox, PRELUDE)
    assert callable(names["deep_layers_on_ssd"])
    assert os.listdir(sandbox / "mnt-nvme") == []  # each run removed its store files


def test_planner_page_examples(sandbox):
    names = run_page("docs/planner.md", sandbox, PRELUDE)
    assert callable(names["policy"])
    assert names["plan"].in_memory  # a graph this small fits: plot_plan draws nothing


def test_every_test_the_fault_table_names_exists():
    """docs/faults.md names the test that checks each fault: each must be a test function in
    that file, so that the table cannot point at a test renamed or removed since."""
    text = (ROOT / "docs" / "faults.md").read_text()
    named = re.findall(r"(tests/test_\w+\.py)::(test_\w+)", text)
    assert len(named) >= 40
    missing = [f"{path}::{name}" for path, name in named
               if not re.search(rf"^def {name}\(", (ROOT / path).read_text(), flags=re.M)]
    assert not missing, missing
