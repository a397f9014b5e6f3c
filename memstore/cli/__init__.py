"""The ``memstore`` command.

A first look (``demo``), conversations from the shell, statistics, and schema
migrations.

Examples::

    memstore demo                                         # what each view keeps, side by side
    memstore db upgrade --url postgresql://app@db/app     # run memstore's migrations
    memstore append chat-1 user "Where is my order?"
    memstore window chat-1 --budget 4000                  # the best context that fits
    memstore window chat-1 --format openai | memstore import - --into copy --format openai

Every command takes ``--url`` (default: ``MEMSTORE_URL``, else ``sqlite:///./memstore.db``).
The reference is generated from the parser: ``docs/cli.md``.
"""

from memstore.cli._app import build_parser, main

__all__ = ["build_parser", "main"]
