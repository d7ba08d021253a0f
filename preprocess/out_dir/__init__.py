"""The output directory and the run's files in it: the lock, the staged run and its publication, the temp files
the stages hand each other (`temp_files`), and the shards assembled there."""
