"""Shared pytest fixtures. Add new fixtures under their own comment header."""

import os

import pytest

# The suite compiles hundreds of small programs and runs each a few times: XLA's cheapest
# optimisation level compiles them about a third faster. The programs compute the same
# functions; every comparison in the suite is between runs under the same flags, within the
# tolerances the tests state. XLA's older CPU fusion emitter compiles them in about 40 % less
# CPU time again (the fresh-clone suite 656 s against 812 s); the one check of two programs
# agreeing bit for bit that it breaks runs in a process of its own under the default emitter
# (tests/test_models.py's switched dropout key). Set before JAX starts its backend (child
# processes inherit it).
_FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                 "--xla_cpu_use_fusion_emitters=false")
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()

import jgrind.datasets  # noqa: E402 - after XLA_FLAGS

# -- XLA's persistent compilation cache, one per test process ----------------------------------
# Many tests compile a program another test compiled already: each `InMemory` and `train` call
# jits new closures around the same computation, and jit's own cache is keyed by the function
# object. JAX's persistent cache is keyed by the program and loads the executable instead (a
# fifth of test_train.py's CPU time). The directory is this process's own and is removed at
# exit: nothing carries over between runs, and no two processes write into one (JAX writes
# its entries in place). Child processes do not inherit it.
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402

_COMPILED = tempfile.mkdtemp(prefix="jgrind-tests-xla-")
atexit.register(shutil.rmtree, _COMPILED, ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", _COMPILED)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


# -- XLA's threads on a share of the cores per xdist worker ---------------------------------------
# XLA splits an op over every core its threads may run on: with two workers on two cores, each
# op of one waits for its shard that shares a core with the other worker. XLA's threads start
# with its backend and keep the cores their thread had then: each worker starts its backend on
# its share (every n-th core), then takes every core back for this thread, so that the processes
# tests start (two-process runs, `jgrind launch`, subprocess cases) and the engine's I/O threads
# run where they did (with the worker pinned whole, they took 25-35 % longer). The suite's test time
# summed over its files: 1446 s against 1585 s (tests/test_engine.py 156 s against 201 s).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKER.startswith("gw") and _WORKERS > 1 and hasattr(os, "sched_setaffinity"):
    _EVERY_CORE = sorted(os.sched_getaffinity(0))
    if len(_EVERY_CORE) >= _WORKERS:
        os.sched_setaffinity(0, _EVERY_CORE[int(_WORKER[2:]) % _WORKERS::_WORKERS])
        try:
            jax.devices()
        finally:
            os.sched_setaffinity(0, _EVERY_CORE)


# -- real datasets (../shared/datasets or $JGRIND_DATA) ------------------------------------------
# Tests that need the real files take `data_root` (the folder) or `data_file` (checks that given
# files exist). Without the data they skip, unless JGRIND_REQUIRE_DATA=1 (CI), where they fail.

def _no_data(detail: str):
    msg = "real datasets not found: set JGRIND_DATA or put ../shared/datasets beside the repo"
    if os.environ.get("JGRIND_REQUIRE_DATA") == "1":
        pytest.fail(f"{msg} ({detail})", pytrace=False)
    pytest.skip(f"{msg} ({detail})")


@pytest.fixture
def data_root():
    root = jgrind.datasets.data_root()
    if root is None or not root.is_dir():
        _no_data(f"data_root() is {root}")
    return root


@pytest.fixture
def data_file(data_root):
    """``data_file("planetoid/ind.cora.x", ...)``: the path of the first, after checking that
    all exist (skip or fail as above if not)."""
    def get(*relpaths):
        for rel in relpaths:
            if not (data_root / rel).is_file():
                _no_data(f"{data_root / rel} is missing")
        return data_root / relpaths[0]
    return get


# -- no hardware profile is measured unless a test says it measures one --------------------------
# A profile measured at full size costs 10-30 s alone and about 50 s beside the suite's other
# process, and a test reaches it by accident (a store folder its profile was not measured in, a
# missing --profile) without failing: only the suite gets slower. So every call of
# `jgrind.plan.measure`'s entry points fails its test, unless the test is marked
# `measures_profile` or is in a module whose subject is measuring. Other tests plan with a
# fixed profile (tests/test_planner.py's `fixed_profile`). Child processes are not covered.
_MEASURING = ("measure", "link_rates", "ssd_rates")
_MEASURING_MODULES = {"test_measure.py", "test_profile.py"}


def _refusing(item, name):
    def refuse(*args, **kwargs):
        pytest.fail(f"{item.nodeid} measured a hardware profile (jgrind.plan.measure.{name}): "
                    "give it a fixed profile (tests/test_planner.py's fixed_profile), or mark it "
                    "@pytest.mark.measures_profile if measuring is what it tests", pytrace=False)
    return refuse


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around setup, call and teardown, so that fixtures of a wider scope are covered when
    they are made."""
    from jgrind.plan import measure as measuring
    allowed = (item.get_closest_marker("measures_profile") is not None
               or item.path.name in _MEASURING_MODULES)
    real = {name: getattr(measuring, name) for name in _MEASURING}
    if not allowed:
        for name in _MEASURING:
            setattr(measuring, name, _refusing(item, name))
    try:
        yield
    finally:
        for name, entry in real.items():
            setattr(measuring, name, entry)
