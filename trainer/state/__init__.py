"""Training state as data: the component table, RNG capture, hashing, the user's own state, samplers,
loaders, worker seeding and determinism switches.

This package must never touch the disk or the process group: it turns live objects into plain data and back.
"""
