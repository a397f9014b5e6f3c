"""Full-text search: an index of every message, kept in step by triggers.

``store.search(query)`` finds messages by their text, tool-call names and arguments,
and tool results (see ``docs/search.md``). This revision creates the index and fills
it from the messages already stored:

* **SQLite**: the FTS5 table ``fts_memstore_messages`` over the external content
  ``fts_memstore_messages_source`` (a view computing each message's searchable text),
  its vocabulary table, and three triggers on ``memstore_messages`` (insert, delete,
  update of the content). A Python whose ``sqlite3`` lacks FTS5 gets no index: the
  revision still succeeds, the store works, and ``search`` says how to create the
  index later.
* **PostgreSQL**: the table ``fts_memstore_messages`` (one ``tsvector`` per message,
  with a GIN index; hash-partitioned like ``memstore_messages`` when that table is), the
  functions computing a message's ``tsvector``, and triggers on ``memstore_messages``
  (statement-level for inserts and deletes, row-level for content updates, and
  truncation).

The text-search configuration is ``simple`` (any language, no stemming) unless
``MEMSTORE_SEARCH_LANGUAGE=english`` is set when the revision runs (English stemming).

Existing messages are indexed in keyset batches of 10,000 (bounded memory), with
progress on a terminal. On PostgreSQL the triggers are created first: writers of
``memstore_messages`` wait until the revision commits, so none escapes the index.
Offline (``--sql``) the backfill is one ``INSERT ... SELECT``.

Downgrade removes the index, its triggers and functions.

Revision ID: 0005
Revises: 0004_recount_changed_rules
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import context, op

from memstore._db import search as _search

revision: str = "0005"
down_revision: str | None = "0004_recount_changed_rules"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if context.is_offline_mode():
        _offline()
        return
    # current=False: the triggers as this revision made them (0007 changes them)
    _search.create_index(op.get_bind(), progress=_search.terminal_progress(), current=False)


def downgrade() -> None:
    if context.is_offline_mode():
        dialect = context.get_context().dialect.name
        for statement in (_search.SQLITE_DROP if dialect == "sqlite"
                          else _search.POSTGRESQL_DROP):
            op.execute(statement)
        return
    _search.drop_index(op.get_bind())


def _offline() -> None:
    dialect = context.get_context().dialect.name
    language = _search.configured_language()
    if dialect == "sqlite":
        for statement in _search.sqlite_ddl(language, split=False):
            op.execute(statement)
        op.execute(f"INSERT INTO {_search.INDEX}({_search.INDEX}) VALUES ('rebuild')")
        return
    for statement in _search.postgresql_ddl(language, index=False, copies=False):
        op.execute(statement)
    op.execute(_search.backfill_sql())
    op.execute(_search.PG_INDEX)
