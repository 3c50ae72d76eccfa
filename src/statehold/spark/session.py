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
from typing import TYPE_CHECKING, Any

from statehold.format import layout
from statehold.storage import LocalStorage, Storage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType


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
    names it: ``_spark/`` inside it (``s3a://`` for S3, Hadoop's connector)."""
    if isinstance(storage, LocalStorage):
        return str(storage.root / layout.SPARK_DIR)
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
