"""Forks copy their search-index rows instead of indexing the copied messages again.

On PostgreSQL, the function of the insert trigger on ``memstore_messages`` (created
by revision 0005) now skips the rows inserted while the transaction-local setting
``memstore.search_copying`` is ``on``. ``fork`` sets it around its copy of the
source's messages, then copies the source's index rows (``tsvector`` documents as
stored): a fork of 100,000 messages no longer parses each message's text again.
Every other write indexes as before. SQLite's FTS5 index cannot copy postings, so
nothing changes there (a fork's messages are indexed by its insert trigger).

Downgrade restores 0005's function. Both directions replace one function, in place;
a database without the index (it was dropped by hand) is left as it is.

Revision ID: 0007_search_fork_copies
Revises: 0006_lifecycle
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import context, op

from memstore._db import search as _search

revision: str = "0007_search_fork_copies"
down_revision: str | None = "0006_lifecycle"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    _replace(copies=True)


def downgrade() -> None:
    _replace(copies=False)


def _replace(*, copies: bool) -> None:
    if context.get_context().dialect.name != "postgresql":
        return
    if not context.is_offline_mode() and not _search.index_exists(op.get_bind()):
        return
    op.execute(_search.insert_function(copies=copies))
