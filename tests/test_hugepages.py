"""Tests of jgrind.hugepages: glibc's huge pages asked for at process start."""

import os
import subprocess
import sys

import pytest

from jgrind import cli, hugepages

needs_thp = pytest.mark.skipif(not hugepages.can_help(), reason=(
    "huge pages cannot help here: needs Linux with transparent huge pages in 'madvise' mode "
    f"and glibc >= 2.35 (mode {hugepages.kernel_mode()!r}, glibc {hugepages.glibc_version()})"))


def _child(code: str, *args: str, **env_changes) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", hugepages.OPT_IN)}
    env.update(env_changes)
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_with_huge_pages_keeps_other_tunables_and_is_idempotent():
    env = {"GLIBC_TUNABLES": "glibc.malloc.check=0:glibc.malloc.hugetlb=0", "HOME": "/x"}
    got = hugepages.with_huge_pages(env)
    assert got["GLIBC_TUNABLES"] == "glibc.malloc.check=0:glibc.malloc.hugetlb=1"
    assert got["HOME"] == "/x" and env["GLIBC_TUNABLES"].endswith("=0")  # a copy
    assert hugepages.with_huge_pages(got) == got
    assert hugepages.requested(got) and not hugepages.requested(env)
    assert hugepages.with_huge_pages({})["GLIBC_TUNABLES"] == hugepages.TUNABLE


def test_kernel_mode_reads_the_bracketed_choice(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert hugepages.kernel_mode(str(f)) == "madvise"
    f.write_text("[always] madvise never\n")
    assert hugepages.kernel_mode(str(f)) == "always"
    assert hugepages.kernel_mode(str(tmp_path / "missing")) is None


@needs_thp
def test_relaunch_restarts_the_interpreter_with_huge_pages():
    code = ("import os, sys, jgrind.hugepages as h; h.relaunch_with_huge_pages(); "
            "print(os.environ.get('GLIBC_TUNABLES'), h.active(), sys.argv[1:])")
    assert _child(code, "a", "b").split() == [hugepages.TUNABLE, "True", "['a',", "'b']"]
    # the command line's hook relaunches only when asked
    hook = code.replace("relaunch_with_huge_pages()", "relaunch_if_wanted()")
    assert _child(hook).split()[:2] == ["None", "False"]
    assert _child(hook, JGRIND_HUGE_PAGES="1").split()[:2] == [hugepages.TUNABLE, "True"]


def test_wanted_reads_the_usual_spellings_of_yes():
    for value in ("1", "true", "YES", " on "):
        assert hugepages.wanted({hugepages.OPT_IN: value})
    for value in ("", "0", "false", "off", "no"):
        assert not hugepages.wanted({hugepages.OPT_IN: value})
    assert not hugepages.wanted({})


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
    huge_pages = int(_child(code, GLIBC_TUNABLES=hugepages.TUNABLE))
    assert small_pages >= 8 * 16384 * 0.9      # one fault per 4 KiB page of every buffer
    assert huge_pages < small_pages / 8, (huge_pages, small_pages)


def test_the_command_line_relaunches_when_asked_but_calls_from_python_do_not(monkeypatch,
                                                                              capsys):
    calls = []
    monkeypatch.setattr(hugepages, "relaunch_with_huge_pages", lambda: calls.append(1))
    monkeypatch.setattr(sys, "argv", ["jgrind", "datasets"])
    monkeypatch.delenv(hugepages.OPT_IN, raising=False)
    assert cli.main() == 0
    assert calls == []                      # opt-in: not asked
    monkeypatch.setenv(hugepages.OPT_IN, "1")
    assert cli.main() == 0
    assert calls == [1]
    assert cli.main(["datasets"]) == 0      # a call from Python never restarts the process
    assert calls == [1]
