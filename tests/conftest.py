"""Shared fixtures: one embedded stack (ZooKeeper + broker) and one local-cluster Spark per session."""

from __future__ import annotations

import logging
import uuid

import pytest

pytest_plugins = ["deploy.pytest_plugin", "tests.s3_server"]


EXECUTORS = 3


@pytest.fixture(scope="session")
def _spark_session():
    from replication.spark_cluster import build_session, stop_session

    session = build_session(f"local-cluster[{EXECUTORS},1,512]", app_name="replication-tests")
    yield session
    stop_session(session)  # the driver JVM too, so nothing is left running


@pytest.fixture
def spark(_spark_session):
    """A local-cluster Spark with 3 executor JVMs (one task slot each), shared by all tests.
    Each test gets it with all 3 executors registered (a kill test leaves a replacement), and a
    test that fails with its job still running has that job cancelled afterwards, so that its
    workers do not hold the executors' slots through every test after it."""
    from replication.spark_cluster import wait_for_executors

    sc = _spark_session.sparkContext
    wait_for_executors(sc, EXECUTORS, timeout=60)
    yield _spark_session
    if sc.statusTracker().getActiveJobsIds():
        logging.getLogger(__name__).warning("a Spark job outlived its test: cancelling it")
        sc.cancelAllJobs()


@pytest.fixture
def topic_prefix() -> str:
    """Unique topic names per test: the session shares one broker."""
    return f"t{uuid.uuid4().hex[:8]}-"
