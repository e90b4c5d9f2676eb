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
    ("foundations", ("jgrind._kernels", "jgrind.arguments", "jgrind.compile_cache",
                     "jgrind.interrupts", "jgrind.sparse", "jgrind.loss", "jgrind.metrics",
                     "jgrind.checkpoint", "jgrind.plots", "jgrind.broadcast")),
    # host memory, disk and transfer plumbing: the engine's, and the planner's to measure it
    ("host I/O", ("jgrind.hostio",)),
    ("graph", ("jgrind.graph", "jgrind.hetero", "jgrind.transforms", "jgrind.generators",
               "jgrind.interop", "jgrind.datasets")),
    ("models", ("jgrind.models",)),
    # the model rewritten into the layers the engine runs, which the planner prices too
    ("executed", ("jgrind.executed",)),
    ("partition", ("jgrind.partition",)),
    ("plan", ("jgrind.plan",)),
    ("engine", ("jgrind.engine", "jgrind.devices")),
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


# -- import circles --------------------------------------------------------------------------------
def module_level_imports(module: str, source: str, modules: set) -> set:
    """The package modules ``module`` imports when it is itself imported: imports at module
    level and in class bodies, not inside functions (those run when called) nor under ``if
    TYPE_CHECKING``. ``from jgrind.x import y`` is ``jgrind.x.y`` where that is a module,
    else ``jgrind.x``."""
    package = module if f"{module}.__init__" in modules else module.rpartition(".")[0]
    found = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(ast.Module(body=child.orelse, type_ignores=[]))
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the package, or one of its parents
                    parent = package.rsplit(".", child.level - 1)[0]
                    base = f"{parent}.{base}" if base else parent
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                             for a in child.names)
            visit(child)

    visit(ast.parse(source))
    return {name for name in found if name in modules and name != module}


def circles(imports: dict) -> list:
    """Each group of modules that import one another, directly or through others (the
    strongly connected components of the import graph with more than one module), sorted."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def connect(node):  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(imports.get(node, ())):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(imports):
        if node not in index:
            connect(node)
    return sorted(groups)


def import_graph() -> dict:
    """``{module: modules it imports at module level}`` over the whole package, its root
    included (``jgrind`` is the key for ``jgrind/__init__.py``)."""
    paths = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        paths[".".join(parts)] = path
    # packages are told apart from modules by their __init__ (see module_level_imports)
    names = set(paths) | {f"{m}.__init__" for m, p in paths.items() if p.name == "__init__.py"}
    return {m: module_level_imports(m, p.read_text(encoding="utf-8"), names)
            for m, p in paths.items()}


def test_no_import_circles():
    """No two jgrind modules import each other, directly or through others, when imported:
    a circle works only in the order Python happens to meet it, and it ties the modules in
    it together (`jgrind.plan.profile` and `jgrind.plan.measure` were one, as were the
    policies and the planner, until each got a module beneath both)."""
    found = circles(import_graph())
    assert not found, "modules that import each other: " + "; ".join(
        " <-> ".join(group) for group in found)


def test_the_circle_check_sees_module_level_imports_only():
    modules = {"jgrind.a", "jgrind.b", "jgrind.c", "jgrind.pkg", "jgrind.pkg.__init__",
               "jgrind.pkg.d"}
    source_a = ("import numpy\n"
                "from jgrind.b import something\n"
                "class A:\n"
                "    from jgrind import c\n"
                "def f():\n"
                "    import jgrind.pkg.d\n")
    assert module_level_imports("jgrind.a", source_a, modules) == {"jgrind.b", "jgrind.c"}
    assert module_level_imports("jgrind.pkg", "from . import d\n", modules) == {"jgrind.pkg.d"}
    assert module_level_imports("jgrind.pkg.d", "from . import a\n", modules) == {"jgrind.pkg"}
    assert module_level_imports("jgrind.pkg.d", "from .. import a\n", modules) == {"jgrind.a"}
    assert module_level_imports("jgrind.a", "if TYPE_CHECKING:\n    import jgrind.b\n",
                                modules) == set()
    assert circles({"jgrind.a": {"jgrind.b"}, "jgrind.b": {"jgrind.c"},
                    "jgrind.c": {"jgrind.a"}, "jgrind.d": {"jgrind.a"}}) == [
        ["jgrind.a", "jgrind.b", "jgrind.c"]]
    assert circles({"jgrind.a": {"jgrind.b"}, "jgrind.b": set()}) == []
