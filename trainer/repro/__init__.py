"""Environment captures: what a job ran with, written on the node that ran it, with every secret redacted.

`capture` writes one capture; `redact` decides what of a value may be written. Both serve `legato run`'s job side
and a script's own Session alike, so this package must never import the orchestrator or torch.
"""
