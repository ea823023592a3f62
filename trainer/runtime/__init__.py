"""Where and how a rank runs: placement on devices, the launchers, the rank entry and what an entrypoint receives.

It stands on every other package of the core (the operating-system layer is legato.system). This package must never
hold training state.
"""
