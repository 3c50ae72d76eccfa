"""On-disk formats: the job directory's layout and file names, the self-verifying JSON
document, the checkpoint metadata (``_metadata``), and what each file in a Spark
checkpoint location is (`spark_layout`). Below everything that reads or
writes a job directory; above storage only."""
