"""jgrind's cache root and the persistent XLA compilation cache (`jgrind.compile_cache`)."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import pytest

from jgrind import _kernels, compile_cache

# A new process trains two epochs out of core (host tier, 3 partitions: several padded
# shapes of forward and backward steps, the sparse product in native code where it builds)
# inside `compilation_cache`, and reports its losses and the persistent cache's hits.
_TRAIN = textwrap.dedent("""
    import json, sys
    import jax, optax
    from jax import monitoring
    import jgrind
    from jgrind.compile_cache import compilation_cache
    from jgrind.generators import csbm

    hits = []
    monitoring.register_event_listener(
        lambda event, **kw: hits.append(event)
        if event == "/jax/compilation_cache/cache_hits" else None)
    graph = csbm(num_nodes=400, num_classes=3, num_features=16, seed=0)
    model = jgrind.models.gcn(16, 32, 3, num_layers=2, dropout=0.5)
    with compilation_cache(sys.argv[1]) as where:
        result = jgrind.train(jax.random.key(0), graph, model, optax.adam(0.01), epochs=2,
                              policy=jgrind.policies.host_offload(), num_parts=3,
                              progress=False)
    print(json.dumps({"where": str(where), "hits": len(hits),
                      "spmm": jgrind.sparse.default_backend(),
                      "losses": [float(h["loss"]) for h in result.history],
                      "dir_after": jax.config.jax_compilation_cache_dir}))
""")


def _train_in_new_process(cache_dir):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    proc = subprocess.run([sys.executable, "-c", _TRAIN, str(cache_dir)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_compiled_steps_and_trains_identically(tmp_path):
    cache_dir = tmp_path / "xla"
    first = _train_in_new_process(cache_dir)
    assert first["where"] == str(cache_dir)
    written = [p for p in cache_dir.rglob("*") if p.is_file()]
    assert len(written) >= 10, "the run's step programs should be in the cache"
    # (a program compiled twice within the first process is already a hit there)
    assert first["hits"] < len(written) // 4, first["hits"]
    second = _train_in_new_process(cache_dir)
    assert second["hits"] >= len(written), (second["hits"], len(written))
    assert second["losses"] == first["losses"]  # bit for bit: the same programs
    if _kernels.available():  # the cached steps call the native sparse product (an FFI target)
        assert first["spmm"] == second["spmm"] == "native"
    # entries truncated or overwritten (a full disk, another program): JAX warns, compiles
    # those programs again, and the run is the same
    for i, entry in enumerate(written):
        data = entry.read_bytes()
        entry.write_bytes(data[: len(data) // 2] if i % 2 else b"not a program")
    third = _train_in_new_process(cache_dir)
    assert third["hits"] == 0 and third["losses"] == first["losses"]
    assert first["dir_after"] is None and second["dir_after"] is None  # settings restored


def test_the_block_restores_jax_settings_and_an_unwritable_directory_only_warns(tmp_path):
    before = (jax.config.jax_compilation_cache_dir,
              jax.config.jax_persistent_cache_min_compile_time_secs)
    with compile_cache.compilation_cache(tmp_path / "xla", min_compile_seconds=0.25) as where:
        assert where == tmp_path / "xla" and where.is_dir()
        assert jax.config.jax_compilation_cache_dir == str(where)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.25
    assert (jax.config.jax_compilation_cache_dir,
            jax.config.jax_persistent_cache_min_compile_time_secs) == before
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.warns(UserWarning, match="not writable"):
        with compile_cache.compilation_cache(blocker / "xla") as where:
            assert where is None
            assert jax.config.jax_compilation_cache_dir == before[0]


def test_cache_root_follows_jgrind_cache_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("JGRIND_CACHE", str(tmp_path / "mine"))
    assert compile_cache.cache_root() == tmp_path / "mine"
    monkeypatch.delenv("JGRIND_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.cache_root() == tmp_path / "xdg" / "jgrind"
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    per_cpu = compile_cache.default_compilation_cache_dir()
    assert per_cpu.parent == tmp_path / "xdg" / "jgrind" / "xla"
    monkeypatch.setattr(compile_cache, "cpu_identity", lambda: "another CPU")
    assert compile_cache.default_compilation_cache_dir() != per_cpu  # other ISA, other programs
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax's"))
    assert compile_cache.default_compilation_cache_dir() == tmp_path / "jax's"
    from jgrind._kernels import build
    from jgrind.plan import profile
    monkeypatch.delenv("JGRIND_PROFILE", raising=False)
    assert build.cache_dir() == tmp_path / "xdg" / "jgrind" / "kernels"
    assert profile.default_path() == tmp_path / "xdg" / "jgrind" / "profile.json"
