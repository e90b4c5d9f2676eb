"""How hard XLA works on each partition step it compiles: a value passed to the engine.

An out-of-core run compiles every layer's forward and backward steps for each padded partition
shape (about 50 programs for a 3-layer GCN in 8 partitions). On a GPU, XLA also autotunes each
program's matrix products and fusions: it compiles and times candidate kernels, and keeps the
fastest. On an H200 (docs/results.md, section 8), the 1M-node benchmark's first `host_offload`
epoch compiled 49 programs in 101 s with autotuning and in 12 s without it. A later epoch took
1.76 s and 1.89 s, a difference within what separate processes varied there (1.55 s for the
first setting in another process). Even if that 0.13 s were real, autotuning would repay its
90 s only after some 700 epochs, and a compile cache (`jgrind.compile_cache`) keeps whichever
programs were built for the next run. So the engine's default is `QUICK`; a long run without a
compile cache can ask for `FULL`.

The options are XLA's own (fields of its ``DebugOptions``, given to ``jax.jit`` as
``compiler_options``). A backend without a GPU ignores the GPU options, and computes the same
numbers either way: autotuning only chooses among kernels for the same products.
"""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class CompileEffort:
    """``options``: XLA compile options for every partition step, as ``(name, value)`` pairs
    (a tuple, so that equal efforts hash equal and share compiled steps)."""

    name: str
    options: tuple = ()

    def compiler_options(self) -> Optional[dict]:
        """``jax.jit``'s ``compiler_options`` (None: XLA's defaults)."""
        return dict(self.options) or None

    def __str__(self) -> str:
        return self.name


FULL = CompileEffort("full")
"""XLA's defaults: on a GPU, every product and fusion autotuned."""

QUICK = CompileEffort("quick", (("xla_gpu_autotune_level", 0),))
"""No GPU autotuning: XLA's heuristics choose each kernel."""

EFFORTS = {effort.name: effort for effort in (FULL, QUICK)}


def by_name(name: str) -> CompileEffort:
    """`FULL` or `QUICK` by name; a ValueError naming the choices otherwise."""
    try:
        return EFFORTS[name]
    except KeyError:
        raise ValueError(f"unknown compile effort {name!r}; choose one of "
                         f"{', '.join(EFFORTS)}") from None
