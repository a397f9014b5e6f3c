"""Cheaper index maintenance: forks copy their index rows; SQLite's triggers by kind.

* **PostgreSQL**: the function of the insert trigger on ``memstore_messages`` (created
  by revision 0005) now skips the rows inserted while the transaction-local setting
  ``memstore.search_copying`` is ``on``. ``fork`` sets it around its copy of the
  source's messages, then copies the source's index rows (``tsvector`` documents as
  stored): a fork no longer parses each copied message's text again.
* **SQLite**: the insert and delete triggers are split by the kind of message. A plain
  message (no parts, no tool calls: most of them) indexes its ``content_text``
  directly; a second trigger of each takes the others through the JSON functions, as
  before. Deleting 100,000 messages (a ``forget``) spends a sixth less time in them.
  FTS5 cannot copy postings, so a fork's messages are indexed as they are inserted.

What is indexed does not change. Downgrade restores 0005's triggers. A database
without the index (a Python without FTS5, or dropped by hand) is left as it is.

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
    _replace(current=True)


def downgrade() -> None:
    _replace(current=False)


def _replace(*, current: bool) -> None:
    if not context.is_offline_mode() and not _search.index_exists(op.get_bind()):
        return
    if context.get_context().dialect.name == "postgresql":
        op.execute(_search.insert_function(copies=current))
        return
    for statement in _search.SQLITE_DROP_TRIGGERS:
        op.execute(statement)
    for statement in _search.sqlite_triggers(split=current):
        op.execute(statement)
