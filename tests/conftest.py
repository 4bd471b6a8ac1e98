"""Shared fixtures: one embedded stack (ZooKeeper + broker) and one local-cluster Spark per session."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest

from deploy.topics import delete_topics_containing

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
def topic_prefix(request) -> Iterator[str]:
    """Unique topic names per test: the session shares one broker.  A test on the stack has every
    topic whose name holds its prefix deleted when it ends (its jobs' heartbeat, order and
    dead-letter topics are named after jobs named with it): the embedded broker rewrites its
    whole table of topics on every idempotent produce and every transaction step, so topics left
    behind by earlier tests made each later test's sinks slower (docs/embedded-broker.md)."""
    prefix = f"t{uuid.uuid4().hex[:8]}-"
    yield prefix
    if "stack" in request.fixturenames:
        delete_topics_containing(request.getfixturevalue("stack").bootstrap_servers, prefix)
