"""legato's supervisor side: the CLI, and everything that watches a run from outside.

It talks to the trainer only through the `python -m legato` entrypoint and
the files the trainer writes (checkpoint manifests, trajectories); of the
trainer it imports only the config schema, the error types and the checkpoint
file-format readers, never the training internals.
"""
