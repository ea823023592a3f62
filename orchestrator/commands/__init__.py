"""The `legato` subcommands, one module per family: supervising (run, watch, train, cancel, requeue), inspecting
(status, logs, plot, repro), verifying (verify) and tooling (init, schema, completion, devcluster).

Each `cmd_*` takes the parsed arguments and returns the command's exit code; legato.orchestrator.cli parses, picks
one and turns errors into exit codes. Nothing here parses arguments, and no module here imports another.
"""
