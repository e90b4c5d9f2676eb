"""The package follows its data flow, graph -> partition -> plan -> engine -> train: no module
imports a later stage (function-level imports included), so each stage can be read, tested and
replaced knowing only the ones before it."""

import ast
import pathlib

import jgrind

PACKAGE = pathlib.Path(jgrind.__file__).parent

# (stage, module prefixes), in data-flow order; a module may import its own stage and earlier
# ones. Every module must be named here: a new one is placed on purpose, not by default.
STAGES = [
    ("foundations", ("jgrind._kernels", "jgrind.allocator", "jgrind.arguments", "jgrind.buffers",
                     "jgrind.caches", "jgrind.checksum", "jgrind.disk_space",
                     "jgrind.host_memory", "jgrind.interrupts", "jgrind.owner_locks",
                     "jgrind.rows", "jgrind.transfers",
                     "jgrind.sparse",
                     "jgrind.loss", "jgrind.metrics", "jgrind.checkpoint", "jgrind.plots")),
    ("graph", ("jgrind.graph", "jgrind.transforms", "jgrind.generators", "jgrind.interop",
               "jgrind.datasets")),
    ("models", ("jgrind.models",)),
    ("partition", ("jgrind.partition",)),
    ("plan", ("jgrind.plan",)),
    ("engine", ("jgrind.engine",)),
    ("train", ("jgrind.train", "jgrind.inference")),
    ("front ends", ("jgrind.config", "jgrind.experiment", "jgrind.cli")),
]


def stage_of(module: str):
    """Index in `STAGES` of the longest prefix naming ``module``, or None."""
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(STAGES):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def imported_modules(source: str):
    """Every ``jgrind`` module the source imports, anywhere in it: ``from jgrind.x import y``
    counts as ``jgrind.x.y`` (y may be a module) and as ``jgrind.x``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("jgrind.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "jgrind" or node.module.startswith("jgrind.")):
            if node.module != "jgrind":
                found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def violations(module: str, source: str):
    """(imported module, its stage) for each import of a later stage than ``module``'s."""
    own = stage_of(module)
    bad = []
    for name in sorted(imported_modules(source)):
        theirs = stage_of(name)
        if theirs is not None and theirs > own:
            bad.append((name, STAGES[theirs][0]))
    return bad


def package_modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts == ("jgrind",):  # the package root gathers the public names of every stage
            continue
        yield ".".join(parts), path


def test_every_module_has_a_stage():
    unplaced = [m for m, _ in package_modules() if stage_of(m) is None]
    assert not unplaced, f"place these modules in a stage of STAGES: {unplaced}"


def test_no_module_imports_a_later_stage():
    found = {m: violations(m, path.read_text(encoding="utf-8")) for m, path in package_modules()}
    found = {m: v for m, v in found.items() if v}
    assert not found, "modules importing a later stage: " + "; ".join(
        f"{m} ({STAGES[stage_of(m)][0]}) imports {', '.join(f'{n} ({s})' for n, s in v)}"
        for m, v in found.items())


def test_the_check_sees_imports_anywhere_in_a_module():
    source = ("import numpy\n"
              "from jgrind.partition import partition_graph\n"
              "def f():\n"
              "    from jgrind.engine import store\n"
              "    import jgrind.train\n")
    assert violations("jgrind.plan.cost", source) == [
        ("jgrind.engine", "engine"), ("jgrind.engine.store", "engine"), ("jgrind.train", "train")]
    assert violations("jgrind.engine.store", source) == [("jgrind.train", "train")]
    assert violations("jgrind.cli", source) == []
