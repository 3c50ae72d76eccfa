"""The driver-side checkpoint lifecycle: the coordinator (begin, acknowledge, complete,
abort, subsume), one attempt from start to close, the write-once publish, savepoints and
the job end, and the no-claim and claim restores."""
