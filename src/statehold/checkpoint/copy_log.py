"""Progress of long work where no terminal shows it: `CopyLog` logs a copy's files and
bytes done of the total (a restore from another job). On a terminal the CLI draws
progress itself (`statehold.cli.output.RichProgress`)."""

from __future__ import annotations

import logging
import threading
import time

#: `CopyLog` writes a line at most this often (seconds) ...
LOG_EVERY_SECONDS = 5.0
#: ... or after this many files, whichever comes first.
LOG_EVERY_FILES = 1000


class CopyLog:
    """Logs a copy's progress (files and bytes done of total) every `LOG_EVERY_FILES`
    files or `LOG_EVERY_SECONDS` seconds, and once at the end; safe from many threads."""

    def __init__(self, log: logging.Logger, what: str, files: int, total_bytes: int) -> None:
        self._log, self._what = log, what
        self._files, self._total_bytes = files, total_bytes
        self._done = self._bytes = self._logged_files = 0
        self._logged_at = time.monotonic()
        self._lock = threading.Lock()

    def add(self, size: int) -> None:
        """One more file of `size` bytes is done."""
        with self._lock:
            self._done += 1
            self._bytes += size
            now = time.monotonic()
            if (
                self._done == self._files
                or self._done - self._logged_files >= LOG_EVERY_FILES
                or now - self._logged_at >= LOG_EVERY_SECONDS
            ):
                self._logged_files, self._logged_at = self._done, now
                self._log.info(
                    "%s: %d of %d files, %d of %d bytes", self._what, self._done,
                    self._files, self._bytes, self._total_bytes,
                )
