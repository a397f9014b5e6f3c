"""The ``memstore`` command.

A first look (``demo``), conversations from the shell, moving them between databases
(``export``/``import``), statistics, and schema migrations.

Examples::

    memstore demo                                         # what each view keeps, side by side
    memstore db upgrade --url postgresql://app@db/app     # run memstore's migrations
    memstore append chat-1 user "Where is my order?"
    memstore window chat-1 --budget 4000                  # the best context that fits
    memstore export --url sqlite:///a.db | memstore import - --url postgresql://app@db/app

Every command takes ``--url`` (default: ``MEMSTORE_URL``, else ``sqlite:///./memstore.db``).
The reference is generated from the parser: ``docs/cli.md``.
"""

from memstore.cli._app import build_parser, main

__all__ = ["build_parser", "main"]
