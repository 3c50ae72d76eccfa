"""The job directory as a whole: a location opened as a job directory or a checkpoint in
one (`locate`), the directory opened once with its storage, HA store and job id
(`directory`), the owner record (`owner`), the running attempt's lease, the job result
store, the checkpoint history, and the job as seen from outside (`status`)."""
