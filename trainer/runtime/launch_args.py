"""The command line of `python -m legato` (legato.runtime.launch), which each rank it starts parses again
(legato.runtime.rank). Free of torch; this module must never import the launcher or the rank."""

from __future__ import annotations

import argparse

from legato.quiet_args import Parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The local launcher's command line: CONFIG, `--nproc` and `--set KEY=VALUE` overrides."""
    parser = Parser(prog="python -m legato", description="Run the legato trainer locally on N processes.")
    parser.add_argument("config", help="YAML config, e.g. configs/tiny_gpt.yaml")
    parser.add_argument("--nproc", type=int, default=None, help="number of ranks (default: local.tasks from the config)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    return parser.parse_args(argv)
