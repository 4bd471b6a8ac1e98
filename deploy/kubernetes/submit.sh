#!/usr/bin/env bash
# Submit a replicated streaming job to Spark on Kubernetes (cluster mode: the driver runs in a pod).
# Every setting is an environment variable; `submit.sh --help` lists them. Background: README.md here.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
  cat <<'EOF'
usage: K8S_API=https://API-SERVER:PORT IMAGE=REGISTRY/IMAGE:TAG NAMESPACE=replication \
       KAFKA=HOST:PORT[,HOST:PORT...] JOB=MODULE:FACTORY [ZOOKEEPER=HOST:PORT[,...][/CHROOT]] \
       deploy/kubernetes/submit.sh [extra spark-submit options...]

Runs spark-submit --master k8s://$K8S_API --deploy-mode cluster with the flags a replicated job
needs. Extra options (e.g. --conf spark.replication.rhino.replicas=2) go before the application
and override the ones set here.

required:
  K8S_API     Kubernetes API server, as `kubectl cluster-info` prints it (https://host:port)
  IMAGE       image with PySpark, this package and the job installed (see Dockerfile)
  NAMESPACE   namespace of the driver and executor pods (namespace.yaml creates "replication")
  KAFKA       bootstrap servers of the external Kafka cluster, reachable from the pods
  JOB         MODULE:FACTORY, a function returning a replication.Job, importable in the image
  ZOOKEEPER   connect string of the external ZooKeeper ensemble; required with MODE=kazoo

optional (default):
  MODE (liverobin)          ordering mode: liverobin or kazoo
  REPLICATION (true)        spark.replication.enabled: two replicas of every partition
  RHINO (true)              spark.replication.rhino.enabled: Rhino checkpoints, restore and rollback
  EXECUTORS (3)             executor pods, one worker each; replication needs 2, replication with
                            Rhino 3, Rhino without replication 2
  EXECUTOR_CPU (2)          cpu request of an executor pod (it still has one task slot)
  EXECUTOR_MEMORY (1g)      executor JVM heap
  EXECUTOR_MEMORY_OVERHEAD (2g)  memory outside the JVM heap: the Python worker, RocksDB, gRPC
  DRIVER_CPU (2)            cpu request of the driver pod
  DRIVER_MEMORY (2g)        driver JVM heap
  METRICS_PORT (9464)       spark.replication.metrics.port; 0 turns the endpoint off
  APP_NAME (replication-job)  Spark application name and the pods' replication-app label
                            (metrics-service.yaml selects replication-app=replication-job)
  SERVICE_ACCOUNT (spark-replication)                    driver service account (rbac.yaml)
  EXECUTOR_SERVICE_ACCOUNT (spark-replication-executor)  executor service account (rbac.yaml)
  STATE_DIR (/var/lib/replication/state)  spark.replication.state.dir, inside the executor
                            template's emptyDir mounted at /var/lib/replication
  DRAIN_AFTER (unset)       seconds after which the job drains its inputs and ends
  WAIT (false)              true: spark-submit waits for the application to end
  SPARK_SUBMIT (spark-submit)  the client's spark-submit, same Spark version as the image
  LAUNCHER (local:///opt/replication/run_job.py)  entry point in the image (see Dockerfile)
  PYTHON (python3)          used to validate the spark.replication.* flags before submitting,
                            if it can import this package (skipped otherwise)
  DRY_RUN (unset)           1: print the spark-submit command instead of running it
EOF
}

case "${1:-}" in
  -h | --help)
    usage
    exit 0
    ;;
esac

MODE="${MODE:-liverobin}"
missing=()
for name in K8S_API IMAGE NAMESPACE KAFKA JOB; do
  if [[ -z "${!name:-}" ]]; then
    missing+=("$name")
  fi
done
if [[ "$MODE" == kazoo && -z "${ZOOKEEPER:-}" ]]; then
  missing+=("ZOOKEEPER (needed by MODE=kazoo)")
fi
if ((${#missing[@]})); then
  echo "error: not set: ${missing[*]}" >&2
  echo >&2
  usage >&2
  exit 2
fi

fail() {
  echo "error: $*" >&2
  echo "(submit.sh --help lists the settings)" >&2
  exit 2
}

REPLICATION="${REPLICATION:-true}"
RHINO="${RHINO:-true}"
EXECUTORS="${EXECUTORS:-3}"
EXECUTOR_CPU="${EXECUTOR_CPU:-2}"
EXECUTOR_MEMORY="${EXECUTOR_MEMORY:-1g}"
EXECUTOR_MEMORY_OVERHEAD="${EXECUTOR_MEMORY_OVERHEAD:-2g}"
DRIVER_CPU="${DRIVER_CPU:-2}"
DRIVER_MEMORY="${DRIVER_MEMORY:-2g}"
METRICS_PORT="${METRICS_PORT:-9464}"
APP_NAME="${APP_NAME:-replication-job}"
SERVICE_ACCOUNT="${SERVICE_ACCOUNT:-spark-replication}"
EXECUTOR_SERVICE_ACCOUNT="${EXECUTOR_SERVICE_ACCOUNT:-spark-replication-executor}"
STATE_DIR="${STATE_DIR:-/var/lib/replication/state}"
DRAIN_AFTER="${DRAIN_AFTER:-}"
WAIT="${WAIT:-false}"
SPARK_SUBMIT="${SPARK_SUBMIT:-spark-submit}"
LAUNCHER="${LAUNCHER:-local:///opt/replication/run_job.py}"
PYTHON="${PYTHON:-python3}"
DRY_RUN="${DRY_RUN:-}"
K8S_API="${K8S_API#k8s://}"

case "$MODE" in
  liverobin | kazoo) ;;
  *) fail "MODE must be liverobin or kazoo, got '$MODE'" ;;
esac
for name in REPLICATION RHINO WAIT; do
  case "${!name}" in
    true | false) ;;
    *) fail "$name must be true or false, got '${!name}'" ;;
  esac
done
[[ "$EXECUTORS" =~ ^[0-9]+$ ]] || fail "EXECUTORS must be a number, got '$EXECUTORS'"
need=1
[[ "$REPLICATION" == true ]] && need=2
[[ "$RHINO" == true ]] && need=$((need + 1))
((EXECUTORS >= need)) || fail "EXECUTORS=$EXECUTORS: REPLICATION=$REPLICATION RHINO=$RHINO needs at least $need"
[[ "$APP_NAME" =~ ^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$ ]] ||
  fail "APP_NAME must be lower-case letters, digits, '-' and '.' (it names pods and a label value)"
[[ "$JOB" == *:* ]] || fail "JOB must be MODULE:FACTORY, got '$JOB'"

# The job's configuration (docs/configuration.md). The driver validates it again when it starts.
replication_conf=(
  "spark.replication.enabled=${REPLICATION}"
  "spark.replication.mode=${MODE}"
  "spark.replication.kafka.bootstrapServers=${KAFKA}"
  "spark.replication.rhino.enabled=${RHINO}"
  "spark.replication.metrics.port=${METRICS_PORT}"
  "spark.replication.state.dir=${STATE_DIR}"
  "spark.replication.workers=${EXECUTORS}"
)
if [[ -n "${ZOOKEEPER:-}" ]]; then
  replication_conf+=("spark.replication.zookeeper.connect=${ZOOKEEPER}")
fi

# Spark on Kubernetes, and what hosting long-running replica workers needs from Spark.
spark_conf=(
  "spark.kubernetes.namespace=${NAMESPACE}"
  "spark.kubernetes.container.image=${IMAGE}"
  "spark.kubernetes.authenticate.driver.serviceAccountName=${SERVICE_ACCOUNT}"
  "spark.kubernetes.authenticate.executor.serviceAccountName=${EXECUTOR_SERVICE_ACCOUNT}"
  "spark.kubernetes.driver.podTemplateFile=${HERE}/driver-pod-template.yaml"
  "spark.kubernetes.executor.podTemplateFile=${HERE}/executor-pod-template.yaml"
  "spark.kubernetes.driver.podTemplateContainerName=spark-kubernetes-driver"
  "spark.kubernetes.executor.podTemplateContainerName=spark-kubernetes-executor"
  "spark.kubernetes.driver.label.replication-app=${APP_NAME}"
  "spark.kubernetes.executor.label.replication-app=${APP_NAME}"
  "spark.kubernetes.submission.waitAppCompletion=${WAIT}"
  "spark.kubernetes.driver.request.cores=${DRIVER_CPU}"
  "spark.kubernetes.executor.request.cores=${EXECUTOR_CPU}"
  "spark.driver.memory=${DRIVER_MEMORY}"
  "spark.executor.instances=${EXECUTORS}"
  # one task slot per executor: two workers never share an executor
  "spark.executor.cores=1"
  "spark.task.cpus=1"
  "spark.executor.memory=${EXECUTOR_MEMORY}"
  "spark.executor.memoryOverhead=${EXECUTOR_MEMORY_OVERHEAD}"
  "spark.dynamicAllocation.enabled=false"
  # every executor loss fails a worker task once; Spark's defaults would end the job early
  "spark.task.maxFailures=100"
  "spark.executor.maxNumFailures=100"
  # an executor only hosts its Python worker: a replacement starts on a third of the CPU
  "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
  "spark.scheduler.mode=FAIR"
  # start the job only once every executor pod has registered (or after 5 minutes)
  "spark.scheduler.minRegisteredResourcesRatio=1.0"
  "spark.scheduler.maxRegisteredResourcesWaitingTime=300s"
  "spark.pyspark.python=/usr/bin/python3"
  "spark.pyspark.driver.python=/usr/bin/python3"
  "spark.python.worker.faulthandler.enabled=true"
)

if "$PYTHON" -c 'import replication.config' >/dev/null 2>&1; then
  "$PYTHON" - "${replication_conf[@]}" <<'PY' || exit 2
import sys

from replication.config import ConfigError, ReplicationConfig

try:
    ReplicationConfig.from_mapping(dict(arg.split("=", 1) for arg in sys.argv[1:]))
except ConfigError as err:
    sys.exit(f"error: invalid configuration:\n{err}")
PY
else
  echo "note: $PYTHON cannot import replication: the spark.replication.* flags are checked by the driver only" >&2
fi

cmd=("$SPARK_SUBMIT" --master "k8s://${K8S_API}" --deploy-mode cluster --name "$APP_NAME")
for conf in "${spark_conf[@]}" "${replication_conf[@]}"; do
  cmd+=(--conf "$conf")
done
cmd+=("$@" "$LAUNCHER" "$JOB")
if [[ -n "$DRAIN_AFTER" ]]; then
  cmd+=(--drain-after "$DRAIN_AFTER")
fi

if [[ -n "$DRY_RUN" ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
