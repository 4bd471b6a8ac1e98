"""The Kubernetes deployment in deploy/kubernetes: the manifests parse, agree with each other and with
submit.sh, submit.sh is valid bash with the flags a replicated job needs, and every
``spark.replication.*`` key the deployment files and the user guide mention exists. Fast: no cluster,
no Spark, no Kafka (submit.sh only runs with DRY_RUN=1 or without its settings)."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import replication
from replication.config import (
    KAFKA_CONSUMER_PREFIX,
    KAFKA_PREFIX,
    KAFKA_PRODUCER_PREFIX,
    KEYS,
    ReplicationConfig,
)

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
SUBMIT = K8S / "submit.sh"
DOCKERFILE = K8S / "Dockerfile"
#: files whose spark.replication.* keys must exist
KEY_DOCS = (SUBMIT, K8S / "README.md", ROOT / "docs" / "user-guide.md")

REQUIRED = {
    "K8S_API": "https://k8s.example.com:6443",
    "IMAGE": "registry.example.com/replication-job:1",
    "NAMESPACE": "replication",
    "KAFKA": "kafka-0.example.com:9092,kafka-1.example.com:9092",
    "JOB": "clicks:build",
}

_KEY_RE = re.compile(r"spark\.replication\.[A-Za-z][A-Za-z0-9_.]*(?:<[^>\s]*>)?")
_PASS_THROUGH = (KAFKA_PREFIX, KAFKA_CONSUMER_PREFIX, KAFKA_PRODUCER_PREFIX)


# --------------------------------------------------------------------------- helpers


def _manifests() -> dict[str, list[Any]]:
    return {p.name: list(yaml.safe_load_all(p.read_text())) for p in sorted(K8S.glob("*.yaml"))}


def _one(name: str, kind: str) -> dict[str, Any]:
    docs = [d for d in _manifests()[name] if d and d.get("kind") == kind]
    assert len(docs) == 1, f"{name}: expected one {kind}, found {len(docs)}"
    return docs[0]


def _submit(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run submit.sh with exactly ``env`` (plus PATH and the Python that can import this package)."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SUBMIT), *args], env={**base, **env}, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def _dry_run(**extra: str) -> tuple[list[str], dict[str, str]]:
    """The spark-submit command submit.sh would run: (argv, the --conf settings)."""
    done = _submit({**REQUIRED, "DRY_RUN": "1", **extra})
    assert done.returncode == 0, done.stderr
    argv = shlex.split(done.stdout)
    confs = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")
    return argv, confs


def _unknown_keys(text: str) -> list[str]:
    """``spark.replication.*`` keys in ``text`` that the configuration does not declare.

    ``spark.replication.kafka.<property>`` (a placeholder in angle brackets) names the pass-through
    prefixes and is accepted; a concrete key must be declared in ``replication.config.KEYS``."""
    names = {k.name for k in KEYS}
    bad = []
    for token in _KEY_RE.findall(text):
        if "<" in token:
            if token[: token.index("<")] not in _PASS_THROUGH:
                bad.append(token)
        elif token.rstrip(".") not in names and token not in _PASS_THROUGH:  # a prefix mention is fine
            bad.append(token.rstrip("."))
    return sorted(set(bad))


def _launcher_source() -> tuple[str, str]:
    """(path in the image, source) of the entry point the Dockerfile writes with a heredoc."""
    m = re.search(r'^COPY [^\n]*<<"?EOF"? (\S+)\n(.*?)\nEOF$', DOCKERFILE.read_text(), re.S | re.M)
    assert m, "Dockerfile: no COPY <<EOF heredoc writing the entry point"
    return m[1], m[2]


# --------------------------------------------------------------------------- manifests


def test_every_manifest_parses_and_names_its_objects():
    found = _manifests()
    assert {"namespace.yaml", "rbac.yaml", "driver-pod-template.yaml", "executor-pod-template.yaml",
            "metrics-service.yaml"} <= set(found)
    for name, docs in found.items():
        assert docs and all(d is not None for d in docs), f"{name}: empty document"
        for doc in docs:
            assert isinstance(doc, dict), f"{name}: a document is not a mapping"
            assert doc.get("apiVersion"), f"{name}: {doc.get('kind')} without apiVersion"
            assert doc.get("kind"), f"{name}: document without kind"
            assert isinstance((doc.get("metadata") or {}).get("name"), str) and doc["metadata"]["name"], (
                f"{name}: {doc['kind']} without metadata.name")


def test_pod_templates_are_pods_with_the_containers_submit_sh_names():
    _, confs = _dry_run()
    for role in ("driver", "executor"):
        path = Path(confs[f"spark.kubernetes.{role}.podTemplateFile"])
        assert path == K8S / f"{role}-pod-template.yaml"
        docs = list(yaml.safe_load_all(path.read_text()))
        assert len(docs) == 1 and docs[0]["kind"] == "Pod" and docs[0]["apiVersion"] == "v1", path.name
        names = [c["name"] for c in docs[0]["spec"]["containers"]]
        assert confs[f"spark.kubernetes.{role}.podTemplateContainerName"] in names, path.name


def test_namespaces_are_consistent():
    found = _manifests()
    namespace = _one("namespace.yaml", "Namespace")["metadata"]["name"]
    for name, docs in found.items():
        for doc in docs:
            if doc["kind"] == "Namespace":
                continue
            assert doc["metadata"].get("namespace") == namespace, f"{name}: {doc['kind']} {doc['metadata']['name']}"
            for subject in doc.get("subjects", []):
                assert subject.get("namespace") == namespace, f"{name}: subject {subject['name']}"
    assert f"NAMESPACE={namespace}" in (K8S / "README.md").read_text()


def test_rbac_lets_the_driver_service_account_create_executor_pods():
    _, confs = _dry_run()
    accounts = {d["metadata"]["name"]: d for d in _manifests()["rbac.yaml"] if d["kind"] == "ServiceAccount"}
    driver_sa = confs["spark.kubernetes.authenticate.driver.serviceAccountName"]
    assert driver_sa in accounts
    assert confs["spark.kubernetes.authenticate.executor.serviceAccountName"] in accounts
    role = _one("rbac.yaml", "Role")
    granted = {(res, verb) for rule in role["rules"] if "" in rule["apiGroups"]
               for res in rule["resources"] for verb in rule["verbs"]}
    for resource in ("pods", "services", "configmaps"):
        for verb in ("create", "get", "list", "watch", "delete"):
            assert (resource, verb) in granted, f"Role lacks {verb} on {resource}"
    binding = _one("rbac.yaml", "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert {"kind": "ServiceAccount", "name": driver_sa} in [
        {k: s[k] for k in ("kind", "name")} for s in binding["subjects"]]


def test_executor_template_keeps_state_on_an_empty_dir_and_spreads_executors_over_nodes():
    _, confs = _dry_run()
    pod = _one("executor-pod-template.yaml", "Pod")
    spec = pod["spec"]
    empty_dirs = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
    container = next(c for c in spec["containers"]
                     if c["name"] == confs["spark.kubernetes.executor.podTemplateContainerName"])
    mounts = [m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in empty_dirs]
    assert mounts, "the executor container mounts no emptyDir"
    state_dir = Path(confs["spark.replication.state.dir"])
    assert any(state_dir.is_relative_to(m) for m in mounts), f"state.dir {state_dir} is not on {mounts}"

    terms = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    term = terms[0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == {"spark-role": "executor"}
    assert "spark-app-selector" in term["matchLabelKeys"]


def test_metrics_service_port_matches_submit_sh():
    _, confs = _dry_run()
    port = int(confs["spark.replication.metrics.port"])
    assert port > 0
    # the value submit.sh uses by default, read from its text too (not only from a dry run)
    text = SUBMIT.read_text()
    var = re.search(r"spark\.replication\.metrics\.port=\$\{?(\w+)\}?", text)[1]
    assert int(re.search(rf'^{var}="\$\{{{var}:-(\d+)\}}"$', text, re.M)[1]) == port

    service = _one("metrics-service.yaml", "Service")
    ports = service["spec"]["ports"]
    assert [p["port"] for p in ports] == [port] and ports[0].get("targetPort", port) == port
    notes = service["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/port"] == str(port)
    assert notes["prometheus.io/path"] == "/metrics"

    driver = _one("driver-pod-template.yaml", "Pod")
    assert port in [p["containerPort"] for c in driver["spec"]["containers"] for p in c.get("ports", [])]
    labels = {"spark-role": "driver", **driver["metadata"].get("labels", {}),
              **{k.removeprefix("spark.kubernetes.driver.label."): v for k, v in confs.items()
                 if k.startswith("spark.kubernetes.driver.label.")}}
    assert service["spec"]["selector"].items() <= labels.items(), "the Service does not select the driver pod"


# --------------------------------------------------------------------------- submit.sh


def test_submit_sh_is_valid_bash():
    done = subprocess.run(["bash", "-n", str(SUBMIT)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert SUBMIT.read_text().startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in SUBMIT.read_text()


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_submit_sh_prints_usage_when_a_variable_is_missing(missing):
    done = _submit({k: v for k, v in REQUIRED.items() if k != missing})
    assert done.returncode == 2
    assert "usage:" in done.stderr and f"not set: {missing}" in done.stderr
    assert done.stdout == ""


def test_submit_sh_needs_zookeeper_for_kazoo_and_refuses_bad_settings():
    done = _submit({**REQUIRED, "MODE": "kazoo"})
    assert done.returncode == 2 and "ZOOKEEPER" in done.stderr and "usage:" in done.stderr
    done = _submit({**REQUIRED, "DRY_RUN": "1", "EXECUTORS": "2"})  # replication + Rhino need 3
    assert done.returncode == 2 and "EXECUTORS=2" in done.stderr
    done = _submit({**REQUIRED, "DRY_RUN": "1", "KAFKA": "no-port"})  # validated with replication.config
    assert done.returncode == 2 and "spark.replication.kafka.bootstrapServers" in done.stderr
    assert _submit({"K8S_API": "x"}, "--help").returncode == 0


@pytest.mark.parametrize("mode", ["liverobin", "kazoo"])
def test_submit_sh_runs_spark_submit_with_the_flags_a_replicated_job_needs(mode):
    extra = {"MODE": mode, "ZOOKEEPER": "zk-0.example.com:2181/replication"} if mode == "kazoo" else {}
    argv, confs = _dry_run(**extra)
    assert argv[0] == "spark-submit"
    assert argv[argv.index("--master") + 1] == "k8s://" + REQUIRED["K8S_API"]
    assert argv[argv.index("--deploy-mode") + 1] == "cluster"
    launcher, _ = _launcher_source()
    assert argv[-2:] == [f"local://{launcher}", REQUIRED["JOB"]]

    assert confs["spark.kubernetes.namespace"] == REQUIRED["NAMESPACE"]
    assert confs["spark.kubernetes.container.image"] == REQUIRED["IMAGE"]
    assert confs["spark.executor.cores"] == confs["spark.task.cpus"], "one task slot per executor"
    assert int(confs["spark.task.maxFailures"]) >= 100
    assert confs["spark.dynamicAllocation.enabled"] == "false"

    replication_conf = {k: v for k, v in confs.items() if k.startswith("spark.replication.")}
    assert not _unknown_keys(" ".join(replication_conf))
    cfg = ReplicationConfig.from_mapping(replication_conf)  # raises ConfigError if refused
    assert cfg.enabled and cfg.rhino_enabled and cfg.mode == mode
    assert cfg.kafka_bootstrap_servers == REQUIRED["KAFKA"]
    assert cfg.zookeeper_connect == extra.get("ZOOKEEPER")
    assert cfg.workers == int(confs["spark.executor.instances"]) >= 3


# --------------------------------------------------------------------------- keys, Dockerfile


@pytest.mark.parametrize("path", KEY_DOCS, ids=lambda p: p.name)
def test_every_spark_replication_key_mentioned_exists(path):
    text = path.read_text()
    assert _KEY_RE.search(text), f"{path.name} mentions no spark.replication.* key"
    assert _unknown_keys(text) == [], f"{path.name}: not in replication.config.KEYS"


def test_the_key_check_rejects_wrong_keys():
    assert _unknown_keys("--conf spark.replication.rhino.enable=true") == ["spark.replication.rhino.enable"]
    assert _unknown_keys("spark.replication.metrics.Port and spark.replication.kafka.bootstrapServer.") == [
        "spark.replication.kafka.bootstrapServer", "spark.replication.metrics.Port"]
    assert _unknown_keys("spark.replication.kafka.<property>, spark.replication.kafka.consumer.<p>") == []
    assert _unknown_keys("spark.replication.rhino.<key>") == ["spark.replication.rhino.<key>"]
    assert _unknown_keys("keys under `spark.replication.kafka.` pass through") == []


def test_dockerfile_entry_point_compiles_and_uses_the_public_api():
    path, source = _launcher_source()
    assert path == "/opt/replication/run_job.py"
    compile(source, path, "exec")
    imported = {alias.name for node in ast.parse(source).body if isinstance(node, ast.ImportFrom)
                and node.module == "replication" for alias in node.names}
    assert imported and all(hasattr(replication, name) for name in imported), imported
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM apache/spark:\$\{SPARK_VERSION\}-python3$", text, re.M)
    assert 'pyspark==${SPARK_VERSION}' in text
