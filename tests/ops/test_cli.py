"""The command line's entry points: ``python -m replication`` and ``--version``."""

from __future__ import annotations

import subprocess
import sys

from ops.cli import version


def test_python_m_replication_is_the_cli_and_says_its_version():
    done = subprocess.run([sys.executable, "-m", "replication", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"replication {version()}", done
    assert version()[0].isdigit()
