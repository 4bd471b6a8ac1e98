"""Shared fixtures: one embedded stack (ZooKeeper + broker) and one local-cluster Spark per session."""

from __future__ import annotations

import os
import uuid

import pytest

pytest_plugins = ["deploy.pytest_plugin"]


@pytest.fixture(scope="session")
def spark():
    """A local-cluster Spark with 3 executor JVMs (one task slot each), shared by all tests."""
    from replication.spark_cluster import build_session

    session = build_session(os.environ.get("REPLICATION_TEST_MASTER", "local-cluster[3,1,512]"),
                            app_name="replication-tests")
    yield session
    session.stop()


@pytest.fixture
def topic_prefix() -> str:
    """Unique topic names per test: the session shares one broker."""
    return f"t{uuid.uuid4().hex[:8]}-"
