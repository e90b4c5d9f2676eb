"""Tests of jgrind.hostio.allocator: glibc allocator settings (huge pages, heap reuse) asked for at
process start."""

import os
import subprocess
import sys

import pytest

from jgrind import cli
from jgrind.hostio import allocator

HUGE = allocator.HUGE_PAGES.tunables[0]  # glibc.malloc.hugetlb=1
needs_thp = pytest.mark.skipif(not allocator.HUGE_PAGES.can_help(), reason=(
    "huge pages cannot help here: needs Linux with transparent huge pages in 'madvise' mode "
    f"and glibc >= 2.35 (mode {allocator.kernel_mode()!r}, glibc {allocator.glibc_version()})"))
needs_glibc = pytest.mark.skipif(not allocator.HEAP_REUSE.can_help(), reason=(
    f"heap reuse needs glibc >= 2.26 (this C library: glibc {allocator.glibc_version()})"))


# allocator.py needs only the standard library, so the relaunch tests' children load it alone
# rather than through the jgrind package, whose import (JAX and the rest) costs about 2 CPU-s
# in each of their eight interpreter starts (five children, three of which relaunch). Loading
# it from its file runs the same module code; were it ever to import jgrind itself, the
# children would fail.
_ALLOCATOR_ALONE = (
    "import importlib.util, sys\n"
    f"spec = importlib.util.spec_from_file_location('allocator', {allocator.__file__!r})\n"
    "a = sys.modules['allocator'] = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(a)\n")


def _child(code: str, *args: str, **env_changes) -> str:
    ours = {"GLIBC_TUNABLES"} | {s.opt_in for s in allocator.SETTINGS}
    env = {k: v for k, v in os.environ.items() if k not in ours}
    env.update(env_changes)
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_with_huge_pages_keeps_other_tunables_and_is_idempotent():
    env = {"GLIBC_TUNABLES": "glibc.malloc.check=0:glibc.malloc.hugetlb=0", "HOME": "/x"}
    got = allocator.with_settings([allocator.HUGE_PAGES], env)
    assert got["GLIBC_TUNABLES"] == "glibc.malloc.check=0:glibc.malloc.hugetlb=1"
    assert got["HOME"] == "/x" and env["GLIBC_TUNABLES"].endswith("=0")  # a copy
    assert allocator.with_settings([allocator.HUGE_PAGES], got) == got
    assert allocator.HUGE_PAGES.requested(got) and not allocator.HUGE_PAGES.requested(env)
    assert allocator.with_settings([allocator.HUGE_PAGES], {})["GLIBC_TUNABLES"] == HUGE


def test_with_settings_sets_every_tunable_and_replaces_other_values_of_them():
    env = {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=7:glibc.malloc.check=0"}
    got = allocator.with_settings([allocator.HUGE_PAGES, allocator.HEAP_REUSE], env)
    tunables = got["GLIBC_TUNABLES"].split(":")
    assert tunables[0] == "glibc.malloc.check=0"            # unrelated: kept
    assert "glibc.malloc.mmap_max=7" not in tunables         # ours: replaced
    assert set(tunables[1:]) == set(allocator.HUGE_PAGES.tunables
                                    + allocator.HEAP_REUSE.tunables)
    assert allocator.HEAP_REUSE.requested(got) and allocator.HUGE_PAGES.requested(got)
    assert not allocator.HEAP_REUSE.requested(env)
    assert allocator.with_settings([], env) == env


def test_kernel_mode_reads_the_bracketed_choice(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert allocator.kernel_mode(str(f)) == "madvise"
    f.write_text("[always] madvise never\n")
    assert allocator.kernel_mode(str(f)) == "always"
    assert allocator.kernel_mode(str(tmp_path / "missing")) is None


@needs_thp
def test_relaunch_restarts_the_interpreter_with_huge_pages():
    code = _ALLOCATOR_ALONE + (
        "import os; a.relaunch_with_huge_pages(); "
        "print(os.environ.get('GLIBC_TUNABLES'), a.HUGE_PAGES.active(), sys.argv[1:])")
    assert _child(code, "a", "b").split() == [HUGE, "True", "['a',", "'b']"]
    # the command line's hook relaunches only when asked
    hook = code.replace("relaunch_with_huge_pages()", "relaunch_if_wanted()")
    assert _child(hook).split()[:2] == ["None", "False"]
    assert _child(hook, JGRIND_HUGE_PAGES="1").split()[:2] == [HUGE, "True"]


@needs_glibc
def test_relaunch_if_wanted_restarts_with_heap_reuse_when_asked():
    code = _ALLOCATOR_ALONE + (
        "a.relaunch_if_wanted(); "
        "print(a.HEAP_REUSE.active(), a.HUGE_PAGES.active(), a.summary())")
    assert _child(code).split()[:2] == ["False", "False"]
    out = _child(code, JGRIND_REUSE_HEAP="1")
    assert out.split()[:2] == ["True", "False"], out
    assert "heap reuse on" in out


def test_wanted_reads_the_usual_spellings_of_yes():
    for setting in allocator.SETTINGS:
        for value in ("1", "true", "YES", " on "):
            assert setting.wanted({setting.opt_in: value})
        for value in ("", "0", "false", "off", "no"):
            assert not setting.wanted({setting.opt_in: value})
        assert not setting.wanted({})


@needs_thp
def test_huge_pages_cut_the_page_faults_of_fresh_buffers():
    """What the setting is for: XLA's output buffers (64 MiB here, written and freed eight
    times) fault in 2 MiB pages instead of 4 KiB ones. (NumPy already advises huge pages for
    its own large arrays; XLA's CPU runtime does not.)"""
    code = ("import resource, jax, jax.numpy as jnp\n"
            "step = jax.jit(lambda x: x + 1.0)\n"
            "x = jnp.ones(16 * 2**20, jnp.float32); step(x).block_until_ready()\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "for _ in range(8):\n"
            "    step(x).block_until_ready()\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)")
    small_pages = int(_child(code))
    huge_pages = int(_child(code, GLIBC_TUNABLES=HUGE))
    assert small_pages >= 8 * 16384 * 0.9      # one fault per 4 KiB page of every buffer
    assert huge_pages < small_pages / 8, (huge_pages, small_pages)


@needs_glibc
def test_heap_reuse_takes_no_page_faults_for_buffers_it_has_had_before():
    """What heap reuse is for: a 64 MiB output buffer written and freed again and again is
    mapped and faulted in every time by default, and not at all once the heap has grown to hold
    the few buffers in flight.

    XLA frees buffers asynchronously, so how many buffers are in flight, and so how many steps
    the heap takes to grow to hold them, varies from run to run (3 to 10 steps here, and once in
    CI more than 24). So the faults are counted in six windows of eight steps after a warm-up,
    and the test asks of the quietest window: by default it still faults in eight fresh buffers,
    with heap reuse (almost) none."""
    code = ("import resource, jax, jax.numpy as jnp\n"
            "step = jax.jit(lambda x: x + 1.0)\n"
            "x = jnp.ones(16 * 2**20, jnp.float32)\n"
            "for _ in range(16):\n"
            "    step(x).block_until_ready()\n"
            "windows = []\n"
            "for _ in range(6):\n"
            "    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "    for _ in range(8):\n"
            "        step(x).block_until_ready()\n"
            "    windows.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
            "print(*windows)")
    fresh = [int(w) for w in _child(code).split()]
    reused = [int(w) for w in _child(code, GLIBC_TUNABLES=":".join(
        allocator.HEAP_REUSE.tunables)).split()]
    assert min(fresh) >= 8 * 16384 * 0.9          # 4 KiB pages of eight fresh mappings
    assert min(reused) <= 16384 // 4, (reused, fresh)  # not even a quarter of one buffer


def test_the_command_line_relaunches_when_asked_but_calls_from_python_do_not(monkeypatch,
                                                                              capsys):
    calls = []
    monkeypatch.setattr(allocator, "relaunch",
                        lambda settings: calls.append([s.name for s in settings]))
    monkeypatch.setattr(sys, "argv", ["jgrind", "datasets"])
    for setting in allocator.SETTINGS:
        monkeypatch.delenv(setting.opt_in, raising=False)
    assert cli.main() == 0
    assert calls == []                      # opt-in: not asked
    monkeypatch.setenv(allocator.HUGE_PAGES.opt_in, "1")
    assert cli.main() == 0
    assert calls == [["glibc huge pages"]]
    monkeypatch.setenv(allocator.HEAP_REUSE.opt_in, "yes")
    assert cli.main() == 0
    assert calls[-1] == ["glibc huge pages", "heap reuse"]
    assert cli.main(["datasets"]) == 0      # a call from Python never restarts the process
    assert len(calls) == 2
