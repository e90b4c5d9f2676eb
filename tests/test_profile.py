import dataclasses
import json
import os

import pytest

from jgrind.cli import main
from jgrind.plan import profile
from jgrind.plan.profile import PROFILE_VERSION, ProfileError

@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One quick measurement shared by the tests (about half a second), and where it ran."""
    where = tmp_path_factory.mktemp("store")
    return profile.measure(where, quick=True), where


@pytest.fixture
def counted_measure(monkeypatch, measured):
    """`load_or_measure` measures at full size; count its calls and hand it the module's
    measurement: these tests check when it measures and what it saves, and a second real
    measurement, even a quick one, compiles its programs again."""
    calls = []
    got, _ = measured

    def fake(directory=None, **kwargs):
        calls.append(directory)
        return got

    monkeypatch.setattr(profile, "measure", fake)
    return calls


def test_save_load_round_trip_and_default_path(measured, tmp_path, monkeypatch):
    got, _ = measured
    path = profile.save(got, tmp_path / "new" / "profile.json")
    assert profile.load(path) == got
    assert [p.name for p in path.parent.iterdir()] == ["profile.json"]  # no temporary left

    def crash(*args):
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", crash)  # atomic: a failed save leaves the old file
    with pytest.raises(OSError, match="power cut"):
        profile.save(dataclasses.replace(got, created="never"), path)
    monkeypatch.undo()
    assert profile.load(path) == got and [p.name for p in path.parent.iterdir()] == [path.name]
    monkeypatch.delenv("JGRIND_PROFILE", raising=False)
    monkeypatch.setenv("JGRIND_CACHE", str(tmp_path / "cache"))
    assert profile.default_path() == tmp_path / "cache" / "profile.json"
    monkeypatch.setenv("JGRIND_PROFILE", str(tmp_path / "mine.json"))
    assert profile.save(got) == tmp_path / "mine.json" and profile.load() == got


def test_load_of_malformed_files_names_the_file(measured, tmp_path):
    got, _ = measured
    path = tmp_path / "profile.json"
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON") as err:
        profile.load(path)
    assert str(path) in str(err.value) and "jgrind profile" in str(err.value)
    data = got.to_json()
    del data["ssd_read_bw"]
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="'ssd_read_bw' is missing") as err:
        profile.load(path)
    assert str(path) in str(err.value)
    path.write_text(json.dumps({**got.to_json(), "overlap": 2.5}))
    with pytest.raises(ProfileError, match="'overlap'"):
        profile.load(path)
    for steps in ([], [[1000, 5000]], [[1000, 5000, -0.1]], "fast"):
        path.write_text(json.dumps({**got.to_json(), "fused_steps": steps}))
        with pytest.raises(ProfileError, match="'fused_steps'.*nodes, edges, seconds"):
            profile.load(path)
    with pytest.raises(FileNotFoundError):
        profile.load(tmp_path / "absent.json")


def test_stale_reason(measured):
    got, _ = measured
    assert got.stale_reason() is None
    moved = dataclasses.replace(got, machine={**got.machine, "hostname": "elsewhere"})
    assert moved.stale_reason() is None  # containers get new hostnames

    other = dataclasses.replace(got, machine={**got.machine, "cpu": "Imaginary CPU 9000",
                                              "cores": os.cpu_count() + 14})
    why = other.stale_reason()
    assert "another machine" in why and "Imaginary CPU 9000" in why
    assert f"{os.cpu_count() + 14} cores" in why

    ram = got.machine["ram_bytes"]
    assert dataclasses.replace(got, machine={**got.machine, "ram_bytes": int(ram * 1.02)}
                               ).stale_reason() is None
    assert "RAM" in dataclasses.replace(got, machine={**got.machine, "ram_bytes": ram * 2}
                                        ).stale_reason()
    assert "jax '0.0.1'" in dataclasses.replace(got, machine={**got.machine, "jax": "0.0.1"}
                                                ).stale_reason()
    flipped = not got.machine["huge_pages"]
    assert "glibc huge pages" in dataclasses.replace(
        got, machine={**got.machine, "huge_pages": flipped}).stale_reason()
    assert "version 0" in dataclasses.replace(got, version=0).stale_reason()
    # the store's row moves on more threads change the gather and scatter-add rates
    assert "row threads 3 (now 1)" in dataclasses.replace(
        got, machine={**got.machine, "row_threads": 3}).stale_reason()
    older = {k: v for k, v in got.machine.items() if k != "row_threads"}
    assert dataclasses.replace(got, machine=older).stale_reason() is None


def test_load_or_measure_remeasures_a_stale_file(measured, tmp_path, counted_measure):
    got, where = measured
    path = tmp_path / "profile.json"
    profile.save(dataclasses.replace(got, machine={**got.machine, "cpu": "Imaginary CPU"}), path)
    logs = []
    fresh = profile.load_or_measure(path, where, log=logs.append)
    assert counted_measure == [where]
    assert len(logs) == 1 and str(path) in logs[0]
    assert "another machine" in logs[0] and "re-measuring" in logs[0]
    saved = profile.load(path)
    assert saved == fresh and saved.stale_reason() is None


def test_load_or_measure_reuses_a_current_file(measured, tmp_path, monkeypatch):
    got, where = measured
    path = profile.save(got, tmp_path / "profile.json")

    def fail(*args, **kwargs):
        raise AssertionError("measured although the saved profile is current")

    monkeypatch.setattr(profile, "measure", fail)
    # free memory is read again: it is the present's, not the measurement's
    monkeypatch.setattr(profile.host_memory, "available", lambda: 12345 << 20)
    now = dataclasses.replace(got, host_free=12345 << 20, device_free=(
        12345 << 20 if got.machine["backend"] == "cpu" else got.device_free))
    logs = []
    assert profile.load_or_measure(path, log=logs.append) == now
    assert profile.load_or_measure(path, where, log=logs.append) == now
    assert logs == []


def test_load_or_measure_remeasures_when_asked_missing_broken_or_elsewhere(measured, tmp_path,
                                                                          monkeypatch):
    got, where = measured
    calls = []

    def fake(directory=None, **kwargs):
        calls.append(directory)
        return dataclasses.replace(got, created=f"measurement {len(calls)}")

    monkeypatch.setattr(profile, "measure", fake)
    path = profile.save(got, tmp_path / "profile.json")
    logs = []
    assert profile.load_or_measure(path, remeasure=True, log=logs.append).created \
        == "measurement 1"
    assert profile.load(path).created == "measurement 1" and "as asked" in logs[-1]

    other = tmp_path / "other-disk"
    other.mkdir()
    profile.load_or_measure(path, other, log=logs.append)
    assert calls[-1] == other and "measured the SSD in" in logs[-1]

    path.write_text("{broken")
    # a file the user named that is not a profile (another file, passed by mistake) is an
    # error, and stays as it was
    with pytest.raises(ProfileError, match="not valid JSON.*pass a hardware profile file"):
        profile.load_or_measure(path, log=logs.append)
    assert path.read_text() == "{broken" and len(calls) == 2
    # the default profile, unreadable: set aside, not overwritten, and measured again
    monkeypatch.setenv("JGRIND_PROFILE", str(path))
    profile.load_or_measure(log=logs.append)
    assert "not valid JSON" in logs[-1] and profile.load(path).created == "measurement 3"
    kept = path.with_name(path.name + ".unreadable")
    assert kept.read_text() == "{broken" and str(kept) in logs[-1]

    profile.load_or_measure(tmp_path / "absent.json", log=logs.append)
    assert "no hardware profile" in logs[-1] and (tmp_path / "absent.json").exists()
    assert len(calls) == len(logs) == 4


def test_each_store_directory_keeps_its_own_default_profile(measured, tmp_path, monkeypatch):
    """Runs that alternate between two stores measure each once; before, each switch measured
    the machine again and overwrote the one default file."""
    got, _ = measured
    calls = []

    def fake(directory=None, **kwargs):
        calls.append(directory)
        return dataclasses.replace(got, directory=profile._where(directory),
                                   created=f"measurement {len(calls)}")

    monkeypatch.setattr(profile, "measure", fake)
    monkeypatch.delenv("JGRIND_PROFILE", raising=False)
    monkeypatch.setenv("JGRIND_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "disk-a", tmp_path / "disk-b"
    a.mkdir()
    b.mkdir()
    assert len({profile.default_path(), profile.default_path(a), profile.default_path(b)}) == 3
    assert profile.default_path(a) == profile.default_path(str(a) + "/.")  # the same folder
    for directory in (a, b, a, b):
        profile.load_or_measure(None, directory)
    assert calls == [a, b]
    assert profile.load(profile.default_path(a)).directory == str(a.resolve())
    # `jgrind profile --store` saves where `plan --store` and `auto(directory=)` look
    monkeypatch.setattr(profile, "measure", lambda directory=None, **kw: dataclasses.replace(
        got, directory=profile._where(directory), created="by the command"))
    c = tmp_path / "disk-c"
    c.mkdir()
    assert main(["profile", "--store", str(c)]) == 0
    assert profile.load_or_measure(None, c).created == "by the command"


def test_profile_command(tmp_path, capsys):
    path = tmp_path / "out" / "profile.json"
    store = tmp_path / "store"
    store.mkdir()
    assert main(["profile", "--quick", "--out", str(path), "--store", str(store)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "profile: SSD read" in captured.err  # progress, one line per figure
    for unit in ("GFLOP/s", "GB/s", " ms", "GiB", "overlap"):
        assert unit in out
    assert str(path) in out and list(store.iterdir()) == []
    assert profile.load(path).directory == str(store.resolve())

    assert main(["profile", "--show", "--out", str(path)]) == 0
    out = capsys.readouterr().out
    assert "GFLOP/s" in out and str(path) in out and "stale" not in out
    profile.save(dataclasses.replace(profile.load(path), version=0), path)
    assert main(["profile", "--show", "--out", str(path)]) == 0
    assert "stale: it is version 0" in capsys.readouterr().out


def test_profile_command_user_errors(tmp_path, capsys):
    assert main(["profile", "--quick", "--out", str(tmp_path / "p.json"),
                 "--store", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jgrind: error:") and "missing" in err and "Traceback" not in err
    assert not (tmp_path / "p.json").exists()
    assert main(["profile", "--show", "--out", str(tmp_path / "p.json")]) == 2
    assert "no hardware profile" in capsys.readouterr().err


def test_profile_of_an_older_format_is_replaced_not_set_aside(measured, tmp_path,
                                                             counted_measure):
    """A profile written by an older jgrind (a field this version measures is missing) is
    re-measured with a line naming the versions, and replaced: it is not damage to keep."""
    import json

    path = tmp_path / "profile.json"
    fresh, _ = measured
    old = fresh.to_json()
    old["version"] = PROFILE_VERSION - 1
    del old["scatter_add_bw"]
    path.write_text(json.dumps(old))
    lines = []
    with pytest.raises(profile.OlderProfileError, match=f"version {PROFILE_VERSION - 1}"):
        profile.load(path)
    got = profile.load_or_measure(path, tmp_path, log=lines.append)
    assert counted_measure == [tmp_path]
    assert got.version == PROFILE_VERSION and profile.load(path).version == PROFILE_VERSION
    assert "is version" in lines[0] and "re-measuring" in lines[0]
    assert not list(tmp_path.glob("*.unreadable*"))


def test_an_older_profile_without_a_defaulted_field_reads_but_stays_stale(
        measured, tmp_path, counted_measure):
    """A profile saved before a field with a default existed (`codec_bw`), e.g. one measured
    on a GPU machine and studied on a CPU, loads with that default; its version still makes
    `load_or_measure` re-measure on this machine."""
    import json

    path = tmp_path / "profile.json"
    fresh, _ = measured
    old = fresh.to_json()
    old["version"] = PROFILE_VERSION - 1
    del old["codec_bw"], old["device_call"]
    path.write_text(json.dumps(old))
    loaded = profile.load(path)
    assert loaded.codec_bw == {} and loaded.gather_bw == fresh.gather_bw
    assert loaded.device_call == 0.0
    assert "is version" in loaded.stale_reason()
    profile.load_or_measure(path, tmp_path)
    assert counted_measure == [tmp_path]


def test_a_device_tier_call_is_measured_and_priced_per_call(measured):
    """The profile times a device-tier call (profile version 20); the cost model charges it for
    every device-tier block write and read in place of the step latency, which a profile
    without it (0, made by hand or older) still gets."""
    import numpy as np
    from jgrind.plan.cost import D, device_call_seconds, read_block_seconds, write_seconds
    from test_planner import equal_parts_workload, fixed_profile
    fresh, _ = measured
    assert fresh.device_call > 0 and "device call" in fresh.format()
    _, _, _, w = equal_parts_workload(num_parts=4)
    on_device = np.full(w.num_parts, D)
    without, slow = fixed_profile(), fixed_profile(device_call=1e-3)
    assert device_call_seconds(without) == without.step_latency
    for price in (write_seconds, read_block_seconds):
        extra = price(w, slow, 1, on_device) - price(w, without, 1, on_device)
        assert extra == pytest.approx(w.num_parts * (1e-3 - without.step_latency))
