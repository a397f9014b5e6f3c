"""The benchmarked systems, grouped by the database each group builds and shares.

A *group* builds one history in one database (with its first system, the
*importer*) and every system of the group is measured on it: ``memstore`` measures
the sync and the async store on the same rows.
"""

from __future__ import annotations

from benchmarks.systems.base import System

__all__ = ["GROUPS", "PEERS", "group_classes"]

#: every group, in report order
GROUPS = ("memstore", "floor", "langchain", "llamaindex", "openai-agents")
#: groups that only run up to ``--peer-max-size`` messages
PEERS = frozenset({"langchain", "llamaindex", "openai-agents"})


def group_classes(group: str, db_kind: str) -> list[type[System]]:
    """The system classes of ``group`` on ``db_kind`` (imported lazily)."""
    if group == "memstore":
        from benchmarks.systems.memstore_sys import MemstoreAsync, MemstoreSync

        return [MemstoreSync, MemstoreAsync]
    if group == "floor":
        from benchmarks.systems.floor import FloorPostgres, FloorSQLite

        return [FloorSQLite if db_kind == "sqlite" else FloorPostgres]
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
