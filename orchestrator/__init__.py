"""legato's supervisor side: the CLI, and everything that watches a run from outside.

It talks to the trainer only through the `python -m trainer` entrypoint and
the files the trainer writes (checkpoint manifests, trajectories); it never
imports the trainer's internals beyond the config schema and error types.
"""
