"""What importing jgrind does, and does not do, to the process."""

import subprocess
import sys


def test_importing_jgrind_starts_no_jax_backend():
    """A JAX array made at import time starts JAX's backend: on a GPU that reserves most of the
    card's memory at ``import jgrind``, before the user could set ``JAX_PLATFORMS`` or the
    allocator's options (seen on an H100: a benchmark's parent process held 60 GiB, and its
    runs ran out of memory). ``xla_bridge._backends`` is private; it is the one place that says
    whether a backend has started."""
    code = ("import jgrind, jgrind.engine, jgrind.plan, jgrind.train\n"
            "from jax._src import xla_bridge\n"
            "print(sorted(xla_bridge._backends))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
