"""A job's RPC security: its secret and TLS material, and how the CLI on the driver's machine gets them.

The secret is Spark's ``spark.authenticate.secret`` (or ``spark.authenticate.secret.file``) when
``spark.authenticate=true``, otherwise a random one the driver generates for the run.  The
workers get it inside the job they run (like the job's code), so it is never on a command line,
in a log or in the status file.  For ``replication move``/``rescale``/... the driver writes it to
``<status dir>/<job>.rpc``, readable by its own user only, and removes it when the job ends.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from replication.config import ConfigError, ReplicationConfig
from replication.status import status_dir
from transport.security import RpcSecurity, TlsError, TlsMaterial

__all__ = ["job_security", "read_cli_credentials", "remove_cli_credentials", "write_cli_credentials"]


def _spark_secret(spark_conf: Mapping[str, Any]) -> str | None:
    """Spark's application secret when ``spark.authenticate`` is on and the secret is given."""
    if str(spark_conf.get("spark.authenticate", "")).strip().lower() != "true":
        return None
    if spark_conf.get("spark.authenticate.secret"):
        return str(spark_conf["spark.authenticate.secret"])
    for key in ("spark.authenticate.secret.driver.file", "spark.authenticate.secret.file"):
        if spark_conf.get(key):
            try:
                return Path(str(spark_conf[key])).read_text().strip()
            except OSError as exc:
                raise ConfigError([(key, f"{key}={spark_conf[key]}: cannot read it: {exc.strerror or exc}")]) from None
    return None  # YARN and Kubernetes generate Spark's own: ours is generated too


def job_security(spark_conf: Mapping[str, Any], cfg: ReplicationConfig) -> RpcSecurity:
    """The run's secret and TLS material (files read now, on the driver)."""
    try:
        tls = cfg.tls_material()
    except TlsError as exc:  # the files changed since the config was validated
        raise ConfigError([("spark.replication.rpc.tls.certChain", f"spark.replication.rpc.tls: {exc}")]) from None
    secret = _spark_secret(spark_conf)
    return RpcSecurity.from_passphrase(secret, tls) if secret else RpcSecurity.generate(tls)


def _credentials_path(job_name: str) -> Path:
    return status_dir() / f"{job_name}.rpc"


def write_cli_credentials(job_name: str, security: RpcSecurity, cfg: ReplicationConfig) -> Path:
    """Let the CLI on this machine (same user) call the job's driver: the secret, and the paths of
    the TLS files (the CLI reads them itself)."""
    path = _credentials_path(job_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tls = security.tls
    data = {"secret": security.secret.hex(), "tls": None if tls is None else {
        "cert_chain": cfg.rpc_tls_cert_chain, "private_key": cfg.rpc_tls_private_key,
        "trust": cfg.rpc_tls_trust_certs, "server_name": tls.server_name}}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
    return path


def read_cli_credentials(job_name: str) -> RpcSecurity:
    """What :func:`write_cli_credentials` wrote for ``job_name`` (FileNotFoundError if nothing)."""
    data = json.loads(_credentials_path(job_name).read_text())
    tls = data.get("tls")
    material = None if tls is None else TlsMaterial.from_files(tls["cert_chain"], tls["private_key"], tls["trust"],
                                                               tls["server_name"])
    return RpcSecurity(bytes.fromhex(data["secret"]), material)


def remove_cli_credentials(job_name: str) -> None:
    with contextlib.suppress(OSError):
        _credentials_path(job_name).unlink()
