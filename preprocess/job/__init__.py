"""The job that wires the rooms: the Beam pipeline of the stages, and the run that checks an invocation,
runs the pipeline and publishes its output."""
