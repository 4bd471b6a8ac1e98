"""pytest plugin: a session-scoped ``stack`` fixture.

Load it with ``pytest_plugins = ["deploy.pytest_plugin"]``.  The fixture yields
:class:`deploy.stack.StackEndpoints`: external ones when REPLICATION_BOOTSTRAP_SERVERS and
REPLICATION_ZOOKEEPER_CONNECT are set, otherwise an embedded stack started once per session
and stopped at session end (and, failing that, at interpreter exit).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deploy.stack import StackEndpoints, StackError, stack_from_env


@pytest.fixture(scope="session")
def stack() -> Iterator[StackEndpoints]:
    """ZooKeeper + Kafka endpoints shared by the whole test session."""
    try:
        with stack_from_env() as endpoints:
            yield endpoints
    except StackError as exc:
        pytest.fail(f"embedded stack: {exc}", pytrace=False)
