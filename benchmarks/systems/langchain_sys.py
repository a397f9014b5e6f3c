"""LangChain: ``SQLChatMessageHistory`` + ``trim_messages``.

The recommended configuration: one shared ``Engine``; on every turn
``history.messages`` (loads the whole conversation) and
``trim_messages(strategy="last", include_system=True, start_on="human",
token_counter=<per-message tiktoken cl100k counter>)``. The counter reads the
message fields directly (no conversion), with the same cl100k chat formula as every
other system; ``max_tokens`` is the budget minus reply priming, since
``trim_messages`` sums per-message counts.

This module deliberately has no ``from __future__ import annotations``:
``trim_messages`` recognises a per-message counter by its parameter annotation being
the ``BaseMessage`` class itself.
"""

import json
from typing import Any, ClassVar

from benchmarks.systems.base import Msg, SkipSystem, System, package_version
from benchmarks.tokens import ChatFormula

try:
    from langchain_community.chat_message_histories import SQLChatMessageHistory
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        convert_to_openai_messages,
        trim_messages,
    )
except ImportError as exc:  # pragma: no cover - depends on the bench extra
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None

__all__ = ["LangChainSystem", "to_langchain"]

_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}


def to_langchain(m: Msg) -> "BaseMessage":
    """An OpenAI chat dict as the LangChain message a LangChain app would hold."""
    role = m["role"]
    content = m.get("content") or ""
    if role == "system":
        return SystemMessage(content=content)
    if role == "user":
        return HumanMessage(content=content)
    if role == "tool":
        return ToolMessage(content=content, tool_call_id=m["tool_call_id"])
    calls = [
        {
            "name": c["function"]["name"],
            "args": json.loads(c["function"]["arguments"]),
            "id": c["id"],
            "type": "tool_call",
        }
        for c in m.get("tool_calls") or ()
    ]
    return AIMessage(content=content, tool_calls=calls)


def make_counter(formula: ChatFormula) -> Any:
    """A per-message ``token_counter`` for ``trim_messages`` using ``formula``."""
    count_parts = formula.count_parts

    def count_message(message: BaseMessage) -> int:
        content = message.content
        if isinstance(content, str):
            text = content
        else:
            text = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
        calls = [
            (c["id"], c["name"], json.dumps(c["args"]))
            for c in getattr(message, "tool_calls", None) or ()
        ]
        return count_parts(
            _ROLES.get(message.type, message.type),
            text,
            message.name,
            calls,
            getattr(message, "tool_call_id", None),
        )

    return count_message


class LangChainSystem(System):
    """``SQLChatMessageHistory`` (sync engine) + ``trim_messages``."""

    name: ClassVar[str] = "langchain"
    label: ClassVar[str] = "LangChain SQLChatMessageHistory + trim_messages"
    import_chunk_size: ClassVar[int] = 5_000
    import_path: ClassVar[str] = "add_messages (one transaction per 5,000 messages)"

    @staticmethod
    def versions() -> str:
        return package_version("langchain-core", "langchain-community")

    def setup(self) -> None:
        if _IMPORT_ERROR is not None:
            raise SkipSystem(f"LangChain is not installed: {_IMPORT_ERROR}")
        from sqlalchemy import create_engine

        self.engine = create_engine(self.db.url())
        self.histories: dict[str, SQLChatMessageHistory] = {}
        self.counter = make_counter(self.ctx.formula)

    def close(self) -> None:
        self.engine.dispose()

    def history(self, cid: str) -> "SQLChatMessageHistory":
        """The history object of ``cid`` (one per conversation, shared engine)."""
        h = self.histories.get(cid)
        if h is None:
            h = self.histories[cid] = SQLChatMessageHistory(session_id=cid, connection=self.engine)
        return h

    def import_chunk(self, cid: str, chunk: list[Msg], *, main: bool) -> None:
        self.history(cid).add_messages([to_langchain(m) for m in chunk])

    def fetch(self, cid: str, prepared: Any) -> Any:
        messages = self.history(cid).messages
        return trim_messages(
            messages,
            max_tokens=prepared.budget - self.ctx.formula.priming,
            token_counter=self.counter,
            strategy="last",
            include_system=True,
            start_on="human",
        )

    def to_openai(self, native: Any) -> list[Msg]:
        return list(convert_to_openai_messages(native))

    def append(self, cid: str, message: Msg) -> None:
        self.history(cid).add_message(to_langchain(message))
