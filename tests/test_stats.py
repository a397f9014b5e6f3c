"""store.stats(): whole-database totals, on both databases, sync and async."""

from __future__ import annotations

import inspect
from typing import Any

from memstore import Message, StoreStats, migrate


async def call(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def test_stats_counts_conversations_messages_and_tokens(store: Any, db_url: str) -> None:
    empty = await call(store.stats())
    assert isinstance(empty, StoreStats)
    assert (empty.conversations, empty.messages, empty.tokens) == (0, 0, 0)
    assert empty.schema_revision == migrate.heads()[0]
    assert empty.database_bytes is not None and empty.database_bytes > 0

    await call(store.extend("a", [Message.user("one two"), Message.assistant("three")]))
    await call(store.extend("b", [Message.user("four")]))
    await call(store.create_conversation("empty"))
    await call(store.pop("a", 1))
    stats = await call(store.stats())
    tokens = await call(store.count_tokens("a")) + await call(store.count_tokens("b"))
    assert (stats.conversations, stats.messages, stats.tokens) == (3, 2, tokens)
    await call(store.truncate("a", before_seq=2))  # a is now empty: first_seq past last_seq
    await call(store.clear("b"))
    stats = await call(store.stats())
    assert (stats.conversations, stats.messages, stats.tokens) == (3, 0, 0)
