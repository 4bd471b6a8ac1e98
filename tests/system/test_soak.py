"""Slow: a longer run of the demo workload at a higher rate, verified record by record.

    ./dev test -m slow
"""

from __future__ import annotations

import pytest

from ops.workload import run_fraud_workload

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_soak_fraud_workload_stays_exact_under_sustained_load(stack, spark):
    rep = run_fraud_workload(stack.bootstrap_servers, spark, rate=2500, duration_s=60, partitions=2,
                             bad_every=500, conf={"spark.replication.parallelism": "4"})
    assert [c.name for c in rep.checks if not c.exact] == []
    assert rep.result.status == "finished" and rep.result.metrics.gaps == 0
    assert rep.load.produced == 150_000 and rep.decisions > 140_000
