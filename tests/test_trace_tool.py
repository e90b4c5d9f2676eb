"""`tools/trace_epoch.py`: a traced out-of-core epoch and its summary, which sessions without a
GPU read from traces brought back from one."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import trace_epoch  # noqa: E402


def test_busy_time_counts_overlapping_events_once():
    assert trace_epoch._union([(0, 10), (5, 15), (20, 30), (21, 22)]) == 25
    assert trace_epoch._union([]) == 0


def _summarize(monkeypatch, capsys, directory):
    """``trace_epoch.py --summarize DIRECTORY`` in this process (reading a trace needs no
    process of its own): its exit code, stdout and stderr."""
    monkeypatch.setattr(sys, "argv", ["trace_epoch.py", "--summarize", str(directory)])
    try:
        trace_epoch.main()
        code = 0
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def test_a_traced_epoch_is_written_and_summarised(tmp_path, monkeypatch, capsys):
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "trace_epoch.py"), "--rmat", "3000", "30000",
         "--parts", "3", "--epochs", "1", "--features", "16", "--hidden", "16",
         "--variants", "default,pageable", "--trace", str(tmp_path / "trace"),
         "--store", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert "programs compiled in" in text and "(default, traced)" in text
    assert "median epoch per variant: default" in text and "pageable" in text
    # one trace per variant, each summarised: the traced window and its busiest lines
    for name in ("default", "pageable"):
        assert list((tmp_path / "trace" / name).rglob("*.xplane.pb"))
    assert text.count("window ") == 2 and "/host:CPU" in text
    code, out, _ = _summarize(monkeypatch, capsys, tmp_path / "trace" / "default")
    assert code == 0 and "window " in out
    code, _, err = _summarize(monkeypatch, capsys, tmp_path / "nothing")
    assert code == 2 and "no *.xplane.pb" in err


def _epochs(compiled):
    """An ``epoch()`` for `trace_epoch.time_variant` whose epochs take 1, 2, 3, ... seconds
    and compile the given numbers of programs."""
    runs = iter(enumerate(compiled, start=1))
    return lambda: next(runs)


def test_a_variants_first_compiling_epoch_is_not_timed():
    # no compiles: the epochs asked for, all timed
    assert trace_epoch.time_variant(_epochs([0, 0, 0]), 2) == ([1, 2], False, 0)
    # the first epoch compiles: run once more, that one left out of the median
    assert trace_epoch.time_variant(_epochs([10, 0, 0]), 2) == ([2, 3], True, 0)
    # a variant that compiles every epoch still ends; its later epochs count, and say so
    assert trace_epoch.time_variant(_epochs([10, 3, 3]), 2) == ([2, 3], True, 2)
    # a compile after a timed epoch is not a warm-up: it counts
    assert trace_epoch.time_variant(_epochs([0, 5]), 2) == ([1, 2], False, 1)
