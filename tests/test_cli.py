import json
import subprocess
import sys

from jgrind.cli import main
from jgrind.config import RunConfig


def test_help_explains_every_setting(capsys):
    try:
        main(["train", "--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    for name in RunConfig.field_docs():
        assert name in out
    assert len(RunConfig.field_docs()) == len(RunConfig.__dataclass_fields__)


def _run(*args):
    return subprocess.run([sys.executable, "-m", "jgrind.cli", *args], capture_output=True,
                          text=True, timeout=240)


def test_user_mistakes_give_one_line_and_status_2():
    for args, needle in [(["train", "--set", "hiden=3"], "unknown setting 'hiden'"),
                         (["train", "--set", "lr=fast"], "not a valid float"),
                         (["train", "--dataset", "nope"], "nope")]:
        proc = _run(*args, "--no-progress")
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr and "Traceback" not in proc.stderr
        assert proc.stderr.strip().count("\n") == 0


def test_train_on_generated_graph_writes_artefacts(tmp_path):
    out = tmp_path / "run"
    code = main(["train", "--epochs", "5", "--set", "num_nodes=500", "--out", str(out),
                 "--no-progress"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["graph"]["nodes"] == 500 and 0 <= summary["test_mean"] <= 1
    assert (out / "training.png").stat().st_size > 1000
    assert len((out / "metrics-seed0.jsonl").read_text().splitlines()) == 5
