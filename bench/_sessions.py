"""The sessions workload with TTL churn, and the processor both systems run.

Users arrive in cohorts: cohort b starts at batch b and stays active for `active` batches,
then goes silent for good. An active user sends 1-2 events per batch, event time moving
`step` seconds per batch, never behind the watermark. The processor (written for Spark's
``transformWithStateInPandas``; statehold runs the same class) keeps per user a typed
session (closed by an event-time timer `gap` seconds after its last event, which clears
it) and a typed profile with a processing-time TTL. So after `active` batches the live
state is `active` cohorts, everything older must go: sessions by their timers, profiles
by TTL.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

INPUT_DDL = "user STRING, ts BIGINT, page STRING"
OUTPUT_DDL = "user STRING, start BIGINT, end BIGINT, events BIGINT"
SESSION_DDL = "start TIMESTAMP, last TIMESTAMP, events INT"
PROFILE_DDL = "sessions BIGINT, events BIGINT, last_page STRING"


@dataclass(frozen=True)
class SessionsWorkload:
    users_per_cohort: int
    active: int  # batches a cohort stays active
    batches: int
    step: int = 60  # event-time seconds per batch
    gap: int = 90  # a session closes this long after its last event
    delay: int = 30  # watermark delay
    ttl_ms: int | None = 20_000  # profiles expire this long (processing time) after update
    seed: int = 7

    def rows(self, batch: int) -> list[dict[str, Any]]:
        rng = random.Random(self.seed * 100_003 + batch)
        now = 1_700_000_000 + batch * self.step
        out = []
        for cohort in range(max(0, batch - self.active + 1), batch + 1):
            for u in range(self.users_per_cohort):
                for _ in range(rng.randrange(1, 3)):
                    out.append({"user": f"c{cohort:04d}-u{u:06d}",
                                "ts": now - rng.randrange(self.delay // 2),
                                "page": f"/p/{rng.randrange(1000)}"})
        return out

    def sentinel(self, batch: int, ts_offset: int) -> list[dict[str, Any]]:
        """A one-row batch (a user of its own) that moves the watermark far ahead."""
        now = 1_700_000_000 + batch * self.step + ts_offset
        return [{"user": "zz-sentinel", "ts": now, "page": "-"}]


def write_file(path: Path, rows: list[dict[str, Any]]) -> None:
    table = pa.Table.from_pylist(
        rows, pa.schema([("user", pa.string()), ("ts", pa.int64()), ("page", pa.string())])
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


class Sessions(StatefulProcessor):
    """Sessions closed by event-time timers, and a TTL'd profile per user."""

    def __init__(self, gap: int, ttl_ms: int | None) -> None:
        self.gap, self.ttl_ms = gap, ttl_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.session = handle.getValueState("session", SESSION_DDL)
        # Spark 4.3 refuses a TTL in timeMode EventTime
        # (STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL): without one, the
        # session's timer clears the profile too.
        self.profile = handle.getValueState("profile", PROFILE_DDL, self.ttl_ms)

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        events = sorted(
            (int(ts), str(p))
            for pdf in rows
            for ts, p in zip(pdf["ts"], pdf["page"], strict=True)
        )
        current = self.session.get()
        profile = self.profile.get() or (0, 0, "")
        closed = []
        if current is not None:
            self.handle.deleteTimer(_ms(current[1]) + self.gap * 1000)
        for ts, _page in events:
            when = pd.Timestamp(ts, unit="s").to_pydatetime()
            if current is not None and _s(current[1]) + self.gap < ts:
                closed.append(current)
                current = None
            current = (when, when, 1) if current is None else (current[0], when, current[2] + 1)
        assert current is not None
        self.session.update(current)
        self.handle.registerTimer(_ms(current[1]) + self.gap * 1000)
        self.profile.update((profile[0] + len(closed), profile[1] + len(events), events[-1][1]))
        if closed:
            yield _frame(key[0], closed)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        current = self.session.get()
        if self.ttl_ms is None:
            self.profile.clear()
        if current is not None:
            self.session.clear()
            yield _frame(key[0], [current])

    def close(self) -> None:
        pass


def _s(when: Any) -> int:
    return int(pd.Timestamp(when).timestamp())


def _ms(when: Any) -> int:
    return _s(when) * 1000


def _frame(user: str, sessions: list[Any]) -> pd.DataFrame:
    return pd.DataFrame({
        "user": [user] * len(sessions),
        "start": [_s(s[0]) for s in sessions],
        "end": [_s(s[1]) for s in sessions],
        "events": [int(s[2]) for s in sessions],
    })
