"""The command line (``python -m zoo``, the ``zoo`` script): commands
(:mod:`~zoo.cli.commands`), the parser (:mod:`~zoo.cli.parser`) and flag values
(:mod:`~zoo.cli.values`). Nothing in the library imports it."""

from zoo.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
