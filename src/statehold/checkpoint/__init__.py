"""The driver-side checkpoint lifecycle: the coordinator (begin, acknowledge, complete,
abort, subsume) and the collaborators it owns: the attempt's start, a begun checkpoint's
reports, the background reconcile, the write-once publish, savepoints and the job end;
beside it, the no-claim and claim restores."""
