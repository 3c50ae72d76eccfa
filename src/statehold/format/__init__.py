"""On-disk formats: the job directory's layout and file names, the self-verifying JSON
document and the checkpoint metadata (``_metadata``). Below everything that reads or
writes a job directory; above storage only. What each file in a Spark checkpoint location
is lives in `statehold.spark_checkpoints.layout` (``spark_layout`` here is its deprecated
old path)."""
