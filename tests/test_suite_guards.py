"""The suite's own rules (tests/conftest.py): a test measures a hardware profile only when it is
marked to."""

import pytest

from jgrind.plan import measure as measuring


def test_an_unmarked_test_that_measures_a_profile_fails():
    with pytest.raises(pytest.fail.Exception, match=r"measured a hardware profile .*measure\)"):
        measuring.measure(quick=True)
    with pytest.raises(pytest.fail.Exception, match=r"link_rates"):
        measuring.link_rates(1 << 20, repeats=1)
    with pytest.raises(pytest.fail.Exception, match=r"ssd_rates"):
        measuring.ssd_rates("/nonexistent", 1 << 20)


def test_the_profile_module_and_the_cli_reach_the_guarded_entry_point(tmp_path, capsys):
    """`jgrind.plan.profile` looks the entry point up when it measures, so the guard sees
    the measurements a command asks for too (here: a profile for a store folder it has none
    for)."""
    from jgrind.cli import main
    with pytest.raises(pytest.fail.Exception, match="measured a hardware profile"):
        main(["plan", "--set", "num_nodes=100", "--store", str(tmp_path),
              "--profile", str(tmp_path / "absent.json"), "--out", str(tmp_path / "plan")])


@pytest.mark.measures_profile
def test_a_marked_test_gets_the_real_entry_points():
    for name in ("measure", "link_rates", "ssd_rates"):
        entry = getattr(measuring, name)
        assert entry.__module__ == "jgrind.plan.measure" and entry.__qualname__ == name
