"""Checkpoints on disk: the commit protocol, manifests, and the per-rank trajectory log.

This package must never know the Session: it is handed plain state and returns what it committed.
"""
