"""A local SparkSession whose Python workers run this very interpreter.

PySpark starts its Python workers with ``PYSPARK_PYTHON`` (default: ``python3`` on the
PATH), which may be another interpreter without statehold, pyarrow or rocksdict; the
executors would then fail with an import error far from its cause. Setting it to
``sys.executable`` before the session starts avoids that for local runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from statehold.errors import InvalidArgumentError
from statehold.format import layout
from statehold.storage import LocalStorage, Storage
from statehold.storage.azure import AzureStorage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType


#: The host suffix of Azure's public cloud.
AZURE_SUFFIX = "core.windows.net"


def use_this_python() -> None:
    """Make Spark's Python workers use the current interpreter (call before the session
    starts; it has no effect on an already running SparkContext)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def s3a_conf(storage_options: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Spark settings for Hadoop's ``s3a://`` file system (the hadoop-aws connector), so
    Spark's own files (the streaming checkpoint in ``<job>/_spark/``) reach the same S3
    as statehold: the `open_storage` S3 options, else the same ``AWS_*`` variables.

    A custom endpoint (MinIO, a test server) gets path-style requests; an ``http://``
    endpoint turns TLS off; given keys are used as they are (no credential chain)."""
    options = dict(storage_options or {})
    env = os.environ
    endpoint = options.get("endpoint") or env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT")
    region = options.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    key = options.get("access_key_id") or env.get("AWS_ACCESS_KEY_ID")
    secret = options.get("secret_access_key") or env.get("AWS_SECRET_ACCESS_KEY")
    token = options.get("session_token") or env.get("AWS_SESSION_TOKEN")
    conf: dict[str, str] = {}
    prefix = "spark.hadoop.fs.s3a."
    if endpoint:
        conf[prefix + "endpoint"] = str(endpoint)
        conf[prefix + "path.style.access"] = "true"
        if str(endpoint).startswith("http://"):
            conf[prefix + "connection.ssl.enabled"] = "false"
    if region:
        conf[prefix + "endpoint.region"] = str(region)
    if key and secret:
        conf[prefix + "access.key"] = str(key)
        conf[prefix + "secret.key"] = str(secret)
        provider = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        if token:
            conf[prefix + "session.token"] = str(token)
            provider = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        conf[prefix + "aws.credentials.provider"] = provider
    return conf


@dataclass(frozen=True)
class _AbfsTarget:
    """How Hadoop's ABFS connector reaches an Azure storage account."""

    account: str
    #: The account's DFS host, which ABFS URIs name (``<account>.dfs.core.windows.net``).
    host: str
    #: ``host:port`` of an emulator (Azurite) or other custom endpoint, else None.
    emulator: str | None
    #: ``abfss`` (TLS) unless the endpoint is plain ``http://`` (then ``abfs``).
    scheme: str


def _abfs_target(account: str | None, endpoint: str | None) -> _AbfsTarget:
    """An account's blob endpoint as ABFS addresses it: an Azure host
    ``<account>.blob.<suffix>`` becomes ``<account>.dfs.<suffix>``; any other endpoint (an
    emulator's ``http://127.0.0.1:10000/<account>``) is reached through
    ``fs.azure.abfs.endpoint``, with the account as the first path segment."""
    parsed = urlsplit(endpoint) if endpoint else None
    if account is None and parsed is not None:
        account = parsed.path.strip("/").split("/", 1)[0] or None
    if not account:
        raise InvalidArgumentError(
            "no Azure account name for Spark's ABFS connector: give account_name (or "
            "AZURE_STORAGE_ACCOUNT_NAME, or an endpoint URL that names it)"
        )
    scheme = "abfs" if parsed is not None and parsed.scheme == "http" else "abfss"
    host = (parsed.hostname or "") if parsed is not None else ""
    if parsed is None or ".blob." in host:
        suffix = host.split(".blob.", 1)[1] if parsed is not None else AZURE_SUFFIX
        return _AbfsTarget(account, f"{account}.dfs.{suffix}", None, scheme)
    port = parsed.port or (80 if scheme == "abfs" else 443)
    return _AbfsTarget(account, f"{account}.dfs.{AZURE_SUFFIX}", f"{host}:{port}", scheme)


def abfs_conf(storage_options: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Spark settings for Hadoop's ABFS connector (hadoop-azure, ``abfss://``), so Spark's
    own files (``<job>/_spark/``) reach the same Azure account as statehold: the
    `open_storage` Azure options (``account_name``, ``account_key``, ``endpoint``), else
    the same ``AZURE_STORAGE_*`` variables.

    A shared key is set for the account's DFS host. A custom endpoint (Azurite) is
    reached through ``fs.azure.abfs.endpoint`` and spoken to on the Blob endpoint
    (``fs.azure.fns.account.service.type=BLOB``, hadoop-azure 3.4.2 or later), since an
    emulator serves no DFS endpoint and has no hierarchical namespace. An ``http://``
    endpoint gets ``abfs://`` without TLS and the JDK's HTTP client (hadoop-azure 3.5.0's
    Apache client needs a TLS socket factory even for plain HTTP). For ``abfss://`` to an
    endpoint with a self-signed certificate the JVMs must trust it (a trust store in
    ``spark.driver.extraJavaOptions`` / ``spark.executor.extraJavaOptions``)."""
    options = dict(storage_options or {})
    env = os.environ
    endpoint = (options.get("endpoint") or env.get("AZURE_STORAGE_ENDPOINT")
                or env.get("AZURE_ENDPOINT"))
    account = options.get("account_name") or env.get("AZURE_STORAGE_ACCOUNT_NAME")
    key = options.get("account_key") or env.get("AZURE_STORAGE_ACCOUNT_KEY")
    target = _abfs_target(account, str(endpoint) if endpoint else None)
    prefix = "spark.hadoop.fs.azure."
    conf: dict[str, str] = {}
    if target.emulator is not None:
        conf[prefix + "abfs.endpoint"] = target.emulator
        conf[prefix + "fns.account.service.type"] = "BLOB"
        conf[prefix + "account.hns.enabled"] = "false"
    if target.scheme == "abfs":
        conf[prefix + "always.use.https"] = "false"
        conf[prefix + "networking.library"] = "JDK_HTTP_URL_CONNECTION"
    if key:
        conf[f"{prefix}account.auth.type.{target.host}"] = "SharedKey"
        conf[f"{prefix}account.key.{target.host}"] = str(key)
    return conf


def classpath_conf(jars: Sequence[str]) -> dict[str, str]:
    """Spark settings putting local `jars` (e.g. spark-sql-kafka, hadoop-aws and their
    dependencies) on the driver's and the executors' class path. Unlike ``spark.jars``
    no jar is copied per executor, and Hadoop finds the ``s3a`` file system there; the
    paths must exist on every machine running an executor."""
    if not jars:
        return {}
    path = os.pathsep.join(jars)
    return {"spark.driver.extraClassPath": path, "spark.executor.extraClassPath": path}


def local_session(
    app_name: str = "statehold",
    *,
    master: str = "local[2]",
    shuffle_partitions: int = 4,
    ui: bool = False,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A small local session for examples and tests (quiet logs, few shuffle partitions);
    `conf`: more settings (class path ones only take effect in a new JVM)."""
    use_this_python()
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", str(ui).lower())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    for name, value in (conf or {}).items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spark_checkpoint_location(storage: Storage) -> str:
    """Where Spark's streaming checkpoint of the job directory `storage` goes, as Spark
    names it: ``_spark/`` inside it (``s3a://`` for S3, ``abfss://`` for Azure: Hadoop's
    connectors)."""
    if isinstance(storage, LocalStorage):
        return str(storage.root / layout.SPARK_DIR)
    if isinstance(storage, AzureStorage):
        target = _abfs_target(storage.account_name, storage.blob_endpoint)
        path = "/".join(p for p in (storage.prefix, layout.SPARK_DIR) if p)
        return f"{target.scheme}://{storage.bucket}@{target.host}/{path}"
    uri = storage.uri
    if uri.startswith("s3://"):
        uri = "s3a://" + uri[len("s3://") :]
    return f"{uri}/{layout.SPARK_DIR}"


class SchemaParser:
    """Spark's DDL strings parsed by Spark itself, each once: a parse costs a round trip to
    the JVM, and a job parses the same few every batch."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._parsed: dict[str, StructType] = {}

    def struct(self, schema: StructType | str) -> StructType:
        from pyspark.sql.types import StructType

        if isinstance(schema, StructType):
            return schema
        parsed = self._parsed.get(schema)
        if parsed is None:
            parsed = self._parsed[schema] = self.spark.createDataFrame([], schema).schema
        return parsed
