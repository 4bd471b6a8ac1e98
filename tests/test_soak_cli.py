"""``replication soak`` refuses what it cannot run, in one line, before starting anything."""

from __future__ import annotations

import pytest

from replication import soak


def test_a_fault_outside_the_mode_s_catalogue_is_refused_in_one_line(capsys):
    assert soak.main(["--mode", "kazoo", "--faults", "pause-long,kill-generator"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "kill-generator" in err and "kazoo catalogue" in err


def test_run_soak_refuses_unknown_faults_before_starting_a_stack():
    with pytest.raises(ValueError, match="not in the liverobin catalogue"):
        soak.run_soak("liverobin", 10, 1, faults=("restart-zookeeper",))
