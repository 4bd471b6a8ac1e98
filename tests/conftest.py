"""Shared fixtures: one embedded stack (ZooKeeper + broker) and one local-cluster Spark per session."""

from __future__ import annotations

import uuid

import pytest

pytest_plugins = ["deploy.pytest_plugin"]


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
    Each test gets it with all 3 executors registered (a kill test leaves a replacement)."""
    from replication.spark_cluster import wait_for_executors

    wait_for_executors(_spark_session.sparkContext, EXECUTORS, timeout=60)
    return _spark_session


@pytest.fixture
def topic_prefix() -> str:
    """Unique topic names per test: the session shares one broker."""
    return f"t{uuid.uuid4().hex[:8]}-"
