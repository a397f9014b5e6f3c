"""memstore's tables, for Alembic autogenerate beside an application's own models.

``memstore.schema.metadata`` is the SQLAlchemy ``MetaData`` holding memstore's tables
(see docs/migrations.md). The definitions live in the SQL layer, ``memstore._db.schema``.
"""

from memstore._db.schema import VERSION_TABLE, conversations, messages, metadata, summaries

__all__ = ["VERSION_TABLE", "conversations", "messages", "metadata", "summaries"]
