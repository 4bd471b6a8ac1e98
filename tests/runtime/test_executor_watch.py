"""The executor watch: a worker learns within milliseconds that its executor JVM began to exit."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from replication.runtime.executor_watch import ExecutorWatch, exiting

RUNNING = "4242 (java) S 1 4242 4242 0 -1 4194560 5 0 0 0 0 0 0 0 20 0 57 0 100 0 0"
DYING = "4242 (java) S 1 4242 4242 0 -1 4194564 5 0 0 0 0 0 0 0 20 0 57 0 100 0 0"  # flags | PF_EXITING


def test_a_running_or_stopped_process_is_not_exiting() -> None:
    assert not exiting(RUNNING)
    assert not exiting(RUNNING.replace(") S ", ") T "))  # paused: a hang, left to the silence timeout
    assert not exiting("4242 (a name (with) spaces) R 1 4242 4242 0 -1 4194560 5 0 0")


def test_a_process_that_began_to_exit_or_is_a_zombie_is_exiting() -> None:
    assert exiting(DYING)
    assert exiting(RUNNING.replace(") S ", ") Z "))
    assert exiting(RUNNING.replace(") S ", ") X "))
    assert exiting("4242 (java)")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.parametrize("checks_per_second", [0.01, 200])  # the pidfd alone; the stat reads too
def test_the_watch_calls_back_once_when_the_process_dies(sig: int, checks_per_second: float) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    called: list[int] = []
    done = threading.Event()
    watch = ExecutorWatch(child.pid, lambda: (called.append(1), done.set()),
                          checks_per_second=checks_per_second).start()
    try:
        assert not watch.gone()
        child.send_signal(sig)
        assert done.wait(10)
        assert watch.gone()
    finally:
        child.kill()
        child.wait()
    watch.stop()
    assert called == [1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_stopped_watch_never_calls_back_and_a_paused_process_is_not_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    called: list[int] = []
    watch = ExecutorWatch(child.pid, lambda: called.append(1), checks_per_second=0.01).start()
    try:
        child.send_signal(signal.SIGSTOP)
        assert not watch.gone()
        child.send_signal(signal.SIGCONT)
        watch.stop()  # returns at once, though the next check is 100 s away
        assert not watch.running
        child.kill()
        child.wait()
    finally:
        child.kill()
        child.wait()
    assert called == []
