"""The public loop: `Session` and the objects it delegates to (resume, saving, replay, telemetry).

This package must never be imported by `legato.state`, `legato.store` or `legato.dist`.
"""
