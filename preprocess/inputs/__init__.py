"""Reading the inputs: each corpus layout (directories, manifests, clips packed in parquet exports, tars and
long recordings) read into rows, several inputs merged, and the read stage that batches the rows."""
