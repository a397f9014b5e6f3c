"""The benchmarked systems, grouped by the database each group builds and shares.

A *group* builds one history in one database (with its first system, the
*importer*) and every system of the group is measured on it: ``memstore`` measures
the sync and the async store (and the store without its row cache) on the same
rows; ``floor`` measures its sync and async variants on one table.
"""

from __future__ import annotations

from benchmarks.systems.base import System

__all__ = ["GROUPS", "PAIRED_FLOOR", "PEERS", "floor_classes", "group_classes"]

#: every group, in report order
GROUPS = ("memstore", "floor", "langchain", "llamaindex", "openai-agents")
#: groups that only run up to ``--peer-max-size`` messages
PEERS = frozenset({"langchain", "llamaindex", "openai-agents"})


#: memstore variants and the floor each is held to, like for like (sync vs sync).
PAIRED_FLOOR = {
    "memstore": "floor",
    "memstore-async": "floor-async",
    "memstore-nocache": "floor",
}


def floor_classes(db_kind: str) -> list[type[System]]:
    """The floor's sync and async classes on ``db_kind``."""
    from benchmarks.systems.floor import (
        FloorPostgres,
        FloorPostgresAsync,
        FloorSQLite,
        FloorSQLiteAsync,
    )

    if db_kind == "sqlite":
        return [FloorSQLite, FloorSQLiteAsync]
    return [FloorPostgres, FloorPostgresAsync]


def group_classes(group: str, db_kind: str) -> list[type[System]]:
    """The system classes of ``group`` on ``db_kind`` (imported lazily)."""
    if group == "memstore":
        from benchmarks.systems.memstore_sys import MemstoreAsync, MemstoreNoCache, MemstoreSync

        return [MemstoreSync, MemstoreAsync, MemstoreNoCache]
    if group == "floor":
        return floor_classes(db_kind)
    if group == "langchain":
        from benchmarks.systems.langchain_sys import LangChainSystem

        return [LangChainSystem]
    if group == "llamaindex":
        from benchmarks.systems.llamaindex_sys import LlamaIndexSystem

        return [LlamaIndexSystem]
    if group == "openai-agents":
        from benchmarks.systems.agents_sys import AgentsSystem

        return [AgentsSystem]
    raise ValueError(f"unknown system {group!r}; choose from {', '.join(GROUPS)}")
