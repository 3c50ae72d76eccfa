"""The test infrastructure for Kafka: the Maven artifact cache and the real broker."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from tests.support import kafka
from tests.support.infra import jvm
from tests.support.kafka import KafkaBroker


def test_cached_set_needs_no_maven(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fetched set is read from its manifest: no mvn run (none on the PATH here), the
    same jars, every one a real jar file, none of them one PySpark already ships."""
    first = jvm.fetch(jvm.spark_kafka())
    monkeypatch.setattr(jvm.shutil, "which", lambda name: None)
    again = jvm.fetch(jvm.spark_kafka())
    assert again == first
    names = {p.name for p in first}
    assert any(n.startswith("spark-sql-kafka-0-10_") for n in names)
    assert any(n.startswith("kafka-clients-") for n in names)
    shipped = {jvm._artifact_name(j.name) for j in jvm.spark_jars_dir().glob("*.jar")}
    assert not {jvm._artifact_name(n) for n in names} & shipped
    for jar in first:
        assert jar.read_bytes()[:2] == b"PK"


def test_missing_maven_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(jvm.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(jvm.shutil, "which", lambda name: None)
    with pytest.raises(jvm.ArtifactError, match="no `mvn`"):
        jvm.fetch(jvm.kafka_broker())
    assert not list((tmp_path / jvm.kafka_broker().name).glob("*"))


def test_broker_keeps_each_keys_records_in_order(
    kafka_broker: KafkaBroker,
) -> None:
    """Produced records come back complete; one key's records share a partition, in the
    order they were sent, at increasing offsets."""
    kafka_broker.create_topic("broker-selftest", partitions=2)
    assert "broker-selftest" in kafka_broker.topics()
    sent = [(f"k{i % 7}", f"v{i}") for i in range(50)]
    kafka_broker.produce("broker-selftest", sent)
    got = kafka_broker.consume("broker-selftest", len(sent))
    assert sorted((r.key, r.value) for r in got) == sorted(sent)
    by_key: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for r in sorted(got, key=lambda r: (r.partition, r.offset)):
        by_key[r.key].append((r.partition, r.offset, r.value))
    for key, seen in by_key.items():
        assert len({p for p, _, _ in seen}) == 1, key
        assert [v for _, _, v in seen] == [v for k, v in sent if k == key]
    assert {r.partition for r in got} == {0, 1}


def test_cluster_ids_never_look_like_an_option() -> None:
    """CI once drew an id starting with "-", which Kafka's storage tool took for an option."""
    ids = [kafka._cluster_id() for _ in range(2000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids) and all(len(i) == 22 for i in ids)
