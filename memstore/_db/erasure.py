"""How a forget erases its messages from SQLite's full-text index.

FTS5 removes a deleted row from its index with a marker in a newer segment: the older
segments keep the row's words until they are merged. A forget must leave none, so
before it deletes anything it chooses one of three ways (`begin`), and after the
deletes it completes that way (`finish`), in the forget's transaction:

* **in place** (SQLite 3.42 or newer, few messages beside the index: one in
  `IN_PLACE_FACTOR` or fewer): FTS5's ``'secure-delete'`` option removes each deleted
  row's words from every segment holding them. Slow per message (about 1.6 ms, each
  word rewritten where it lies), so only for a few.
* **rebuild** (the forget deletes more than `REBUILD_SHARE` of the indexed messages):
  the index's delete triggers are dropped for the transaction (DDL is transactional in
  SQLite: a failure, or a crash, restores them with everything else), and the index is
  emptied and filled again from the messages that stay. Indexing what stays then costs
  less than what the markers and the merge would: tokenizing a deleted message for its
  marker costs about as much as indexing one, and the merge rewrites every message the
  index holds.
* **merge** (otherwise): the markers, then ``'optimize'`` rewrites the whole index
  without what they mark; its cost grows with the index (seconds per million messages).

``secure_delete`` (on for every memstore connection) zeroes the pages each way frees.
PostgreSQL's index rows are deleted with the messages (``VACUUM`` reclaims their
space): nothing to choose there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy import Connection

from memstore._db.search import INDEX, SOURCE, averages, has_secure_delete, index_exists

__all__ = [
    "IN_PLACE_FACTOR",
    "REBUILD_SHARE",
    "Erasure",
    "begin",
    "finish",
    "purge_deleted",
]

#: In place when the index holds at least this many times the messages deleted.
#: Measured on 1,000,000 indexed messages (SQLite 3.51): an in-place delete costs about
#: 1.6 ms a message, a merge of the whole index about 2 s plus 10 µs a message deleted.
IN_PLACE_FACTOR = 800
#: Rebuild when more than this share of the indexed messages goes: about where the two
#: ways cost the same (`python -m benchmarks.lifecycle --db sqlite --phases erasure
#: [--full]` times both at several shares). Where they cross depends on the text: on
#: the benchmarks' agent conversations (300,000 messages, SQLite 3.40) merge/rebuild
#: took 10.8/9.8 s at a share of 0.25 and 12.1/8.5 s at 0.33; on messages of 35 words
#: from a wide vocabulary (300,000) 10.5/12.5 s at 0.33 and 13.8/12.5 s at 0.4 (SQLite
#: 3.51: 8.1/13.4 s at 0.25, 11.1/9.4 s at 0.4).
REBUILD_SHARE = 1 / 3

#: The index's delete triggers (revision 0007 splits plain messages from the others;
#: revision 0005 has the first one only).
_DELETE_TRIGGERS = ("memstore_search_delete", "memstore_search_delete_parts")

Way = Literal["none", "in place", "rebuild", "merge"]


@dataclass
class Erasure:
    """The way a forget chose (`begin`) and what `finish` needs to complete it.

    Attributes:
        way: ``"none"`` (PostgreSQL, no index, or nothing deleted), ``"in place"``,
            ``"rebuild"`` or ``"merge"``.
        triggers: the SQL of the delete triggers a rebuild dropped (created again by
            `finish`).
    """

    way: Way
    triggers: list[str] = field(default_factory=list)


def begin(conn: Connection, messages: Callable[[], int]) -> Erasure:
    """Choose how the forget's ``messages()`` deleted messages leave the index.

    Called in the forget's transaction before it deletes anything (``messages`` is
    called only on SQLite with the index). For ``"in place"`` FTS5's
    ``'secure-delete'`` is switched on; for ``"rebuild"`` the delete triggers are
    dropped. The index's format number becomes 5 at the first in-place delete: SQLite
    before 3.42 refuses to read or write it from then on (memstore says so, naming the
    fix: rebuilding the index, which `memstore._db.search.drop_index` makes possible).
    """
    if conn.dialect.name != "sqlite" or not index_exists(conn):
        return Erasure("none")
    indexed, _ = averages(conn.exec_driver_sql(
        f"SELECT block FROM {INDEX}_data WHERE id = 1").scalar())
    deleted = messages()
    if deleted == 0:  # nothing goes (a selector that matched nothing): nothing to erase
        return Erasure("none")
    if has_secure_delete(conn) and deleted * IN_PLACE_FACTOR <= indexed:
        conn.exec_driver_sql(f"INSERT INTO {INDEX}({INDEX}, rank) VALUES ('secure-delete', 1)")
        return Erasure("in place")
    if deleted > REBUILD_SHARE * indexed:
        found = conn.exec_driver_sql(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND "
            "tbl_name = 'memstore_messages' AND name IN (?, ?) ORDER BY name",
            _DELETE_TRIGGERS).all()
        for name, _sql in found:
            conn.exec_driver_sql(f"DROP TRIGGER {name}")
        return Erasure("rebuild", [sql for _name, sql in found])
    return Erasure("merge")


def finish(conn: Connection, erasure: Erasure) -> None:
    """Complete the erasure `begin` chose, after the forget's deletes."""
    if erasure.way == "in place":
        # Off again: other deletes (prune, clear) stay cheap.
        conn.exec_driver_sql(f"INSERT INTO {INDEX}({INDEX}, rank) VALUES ('secure-delete', 0)")
    elif erasure.way == "rebuild":
        conn.exec_driver_sql(f"INSERT INTO {INDEX}({INDEX}) VALUES ('delete-all')")
        conn.exec_driver_sql(f"INSERT INTO {INDEX}(rowid, body) SELECT id, body FROM {SOURCE}")
        for statement in erasure.triggers:
            conn.exec_driver_sql(statement)
    elif erasure.way == "merge":
        purge_deleted(conn)


def purge_deleted(conn: Connection) -> None:
    """Rewrite SQLite's index without what deleted messages left in it.

    FTS5 marks a deleted message in a newer segment; the older one still holds its
    words until they merge. This merges them all now (``'optimize'``: the whole index
    rewritten, seconds per million messages).
    """
    if conn.dialect.name == "sqlite" and index_exists(conn):
        conn.exec_driver_sql(f"INSERT INTO {INDEX}({INDEX}) VALUES ('optimize')")
