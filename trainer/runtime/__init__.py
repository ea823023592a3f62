"""Where and how a rank runs: placement on devices, threads, launchers, the rank entry, parent death,
processes and signals.

This package must never hold training state.
"""
