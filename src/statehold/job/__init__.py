"""The job directory as a whole: opening it once (its storage, its HA store, its job id),
the owner record, the running attempt's lease, the job result store, the checkpoint
history, and the job as seen from outside (status)."""
