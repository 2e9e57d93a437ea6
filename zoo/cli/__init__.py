"""The command line (``python -m zoo``, the ``zoo`` script): commands
(:mod:`~zoo.cli.commands`), the parser (:mod:`~zoo.cli.parser`), flag values
(:mod:`~zoo.cli.values`) and the installation's report, ``info`` (:mod:`~zoo.cli.info`).
Nothing in the library imports it."""

from zoo.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
