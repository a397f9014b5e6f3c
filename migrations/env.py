"""Alembic environment for memstore's own revisions.

memstore keeps its history in its own version table (``memstore_alembic_version``)
and only ever compares its own tables, so it can share a database with a host
application's Alembic history. The connection comes from
``config.attributes["connection"]`` (how :mod:`memstore.migrate` calls it); a bare
``alembic`` run reads ``-x url=...`` or ``MEMSTORE_URL``.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool

from memstore._db.schema import VERSION_TABLE, metadata

config = context.config


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    if type_ == "table":
        return bool(name) and str(name).startswith("memstore_") and name != VERSION_TABLE
    return True


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        render_as_batch=True,
        compare_type=True,
        **kwargs,  # type: ignore[arg-type]
    )


def run_offline() -> None:
    url = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get("MEMSTORE_URL")
    _configure(url=url or config.get_main_option("sqlalchemy.url"), literal_binds=True,
               dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get("MEMSTORE_URL")
    if not url:
        raise SystemExit("set MEMSTORE_URL or pass -x url=... to run memstore's migrations")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.begin() as conn:
        _configure(connection=conn)
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
