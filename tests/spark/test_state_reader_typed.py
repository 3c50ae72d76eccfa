"""The state readers show a processor's typed state as plain data, decoded with the
schemas its checkpoint recorded: `iter_state`, `statehold state --format jsonl` and
`read_state` (Spark), on local disk and on S3 (moto). Typed values are not JSON on disk,
so a reader that ignored the record would fail or show bytes."""

from __future__ import annotations

import datetime
import decimal
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from statehold.processor import StatefulProcessor, StatefulProcessorHandle, TimerValues
from statehold.spark import StatefulJob
from statehold.spark.reader import iter_state, read_state

pytestmark = [pytest.mark.spark, pytest.mark.matrix]

PROFILE = "seen TIMESTAMP, spent DECIMAL(10,2), tag BINARY, last STRUCT<page: STRING, n: INT>"
WHEN = datetime.datetime(2024, 5, 6, 7, 8, 9)


class Profiles(StatefulProcessor):
    """Typed value, list and map state per user, plus one untyped value."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.profile = handle.get_value_state("profile", PROFILE)
        self.pages = handle.get_list_state("pages", "page STRING")
        self.hits = handle.get_map_state("hits", "page STRING", "n BIGINT")
        self.plain = handle.get_value_state("plain")

    def handle_input_rows(self, key: Any, rows: Any, timer_values: TimerValues) -> Any:
        user = key[0] if isinstance(key, tuple) else key
        self.profile.update((WHEN, decimal.Decimal("12.50"), b"\x00\xff", ("home", 3)))
        self.pages.append_value(("home",))
        self.pages.append_value(("cart",))
        self.hits.update_value(("home",), (2,))
        self.plain.update({"user": user})
        return [(str(user),)]


EXPECTED = {
    "profile": {
        "seen": WHEN.isoformat(),
        "spent": "12.50",
        "tag": "AP8=",
        "last": {"page": "home", "n": 3},
    },
    "pages": [{"page": "home"}, {"page": "cart"}],
    "hits": {'{"page":"home"}': {"n": 2}},
}


def _expected(user: str) -> dict[str, Any]:
    return {**EXPECTED, "plain": {"user": user}}


Root = tuple[str, dict[str, Any], dict[str, str]]  # URI, storage options, CLI environment


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Root:
    if request.param == "local":
        return str(tmp_path / "jobs"), {}, {}
    server = request.getfixturevalue("s3_server")
    return f"s3://{server.bucket}/typed-{random.getrandbits(32)}", server.options, server.env


def test_typed_state_reads_as_plain_data(spark: Any, root: Root, tmp_path: Path) -> None:
    uri, options, env = root
    job = StatefulJob(spark, uri, "typed", max_parallelism=8, parallelism=2,
                      storage_options=options, local_dir=str(tmp_path / "local"))
    df = spark.createDataFrame([("ann", 1), ("bob", 1)], "user string, n int")
    job.transform_with_state(df, Profiles(), "user string", key="user")
    job.close()
    job_dir = f"{uri}/typed"

    rows = {str(k): s for k, s in iter_state(job_dir, **options)}
    assert set(rows) == {"ann", "bob"}
    for user, states in rows.items():
        assert {n: states[n] for n in _expected(user)} == _expected(user)

    out = tmp_path / "dump"
    done = subprocess.run(
        [sys.executable, "-m", "statehold", "state", job_dir, "--out", str(out),
         "--format", "jsonl"],
        capture_output=True, text=True, timeout=300, env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    dumped = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.open()]
    assert sorted(d["key"] for d in dumped) == ["ann", "bob"]
    for d in dumped:
        assert json.loads(json.dumps(d["profile"])) == EXPECTED["profile"]
        assert d["pages"] == EXPECTED["pages"] and d["plain"] == {"user": d["key"]}

    frame = read_state(spark, job_dir, **options)
    by_key = {r["key"]: r for r in frame.collect()}
    assert set(by_key) == {"ann", "bob"}
    assert json.loads(by_key["ann"]["profile"]) == EXPECTED["profile"]
    assert json.loads(by_key["bob"]["hits"]) == EXPECTED["hits"]
