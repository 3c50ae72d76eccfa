"""On-disk formats: the job directory's layout and file names, the self-verifying JSON
document, and the checkpoint metadata (``_metadata``). Below everything that reads or
writes a job directory; above storage only."""
