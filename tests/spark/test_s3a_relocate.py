"""Spark's own checkpoint on S3: with hadoop-aws on the class path, the streaming
checkpoint of the Kafka pipeline goes to ``s3a://<bucket>/<prefix>/<job>/_spark/`` on the
moto server, so the whole job directory, Spark's offsets included, lives on S3 and moves
as one unit: copied to another bucket with boto3 (S3's server-side copy, the tool any
operator has), the original deleted, the job resumes from the copy with exact results.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from statehold.format import layout
from statehold.storage import open_storage
from tests.support.kafka import KafkaBroker
from tests.support.kafka_runs import (
    JOB,
    check_exact,
    example_args,
    jars_appended,
    new_topic,
    records,
    run_example_to_end,
)

pytestmark = [pytest.mark.spark, pytest.mark.scenario]


def s3_client(server: object) -> object:
    import boto3

    from tests.support.infra.object_store_servers import S3Server

    assert isinstance(server, S3Server)
    return boto3.client(
        "s3", endpoint_url=server.endpoint, region_name=server.region,
        aws_access_key_id=server.access_key_id, aws_secret_access_key=server.secret_access_key,
    )


def keys_under(client: object, bucket: str, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(  # type: ignore[attr-defined]
        Bucket=bucket, Prefix=prefix
    )
    return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


@pytest.mark.timeout(1200)  # two Spark drivers; minutes on a busy shared machine
def test_job_directory_with_sparks_checkpoint_relocates(
    kafka_broker: KafkaBroker,
    s3_server: object,
    tmp_path: Path,
) -> None:
    from tests.support.infra.object_store_servers import S3Server

    assert isinstance(s3_server, S3Server)
    client = s3_client(s3_server)
    topic = new_topic(kafka_broker, "relocate")
    prefix = f"relocate-{os.getpid()}-{random.getrandbits(24)}"
    source = f"s3://{s3_server.bucket}/{prefix}"
    output = tmp_path / "output"
    kafka_broker.produce(topic, records(5, 60))
    stdout = run_example_to_end(
        tmp_path, *jars_appended(example_args(kafka_broker, topic, output, source),
                                 s3_server.env)
    )
    assert f"s3a://{s3_server.bucket}/{prefix}/{JOB}/{layout.SPARK_DIR}" in stdout
    keys = keys_under(client, s3_server.bucket, f"{prefix}/{JOB}/")
    spark_keys = [k for k in keys if k.startswith(f"{prefix}/{JOB}/{layout.SPARK_DIR}/")]
    assert any("/offsets/" in k for k in spark_keys) and any("/commits/" in k for k in spark_keys)
    assert not list(tmp_path.glob("s3a*"))  # nothing went to a local "s3a:" folder

    # Relocate with plain S3 calls: server-side copy of every object, then delete them.
    target_bucket = f"moved-{random.getrandbits(32):08x}"
    client.create_bucket(Bucket=target_bucket)  # type: ignore[attr-defined]
    for key in keys:
        client.copy_object(  # type: ignore[attr-defined]
            Bucket=target_bucket, Key="jobs/" + key[len(prefix) + 1 :],
            CopySource={"Bucket": s3_server.bucket, "Key": key},
        )
    for start in range(0, len(keys), 1000):
        client.delete_objects(  # type: ignore[attr-defined]
            Bucket=s3_server.bucket,
            Delete={"Objects": [{"Key": k} for k in keys[start : start + 1000]]},
        )
    assert keys_under(client, s3_server.bucket, f"{prefix}/") == []

    kafka_broker.produce(topic, records(6, 30))
    moved = f"s3://{target_bucket}/jobs"
    stdout = run_example_to_end(
        tmp_path, *jars_appended(example_args(kafka_broker, topic, output, moved),
                                 s3_server.env)
    )
    assert "checkpoint 0," not in stdout  # resumed, not started over
    job = open_storage(f"{moved}/{JOB}", **s3_server.options)
    check_exact(kafka_broker, topic, 90, job, output, tmp_path)
    assert keys_under(client, s3_server.bucket, f"{prefix}/") == []  # the original stays gone
