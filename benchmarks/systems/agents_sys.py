"""OpenAI Agents SDK: ``SQLAlchemySession`` + trimming in Python.

The session stores Responses-API input items as JSON (the system prompt as a
``system`` item, assistant text as output messages, ``function_call`` and
``function_call_output`` items). It has no token-aware read, so a user who needs a
budget does what the harness does on every turn: ``get_items()`` (everything),
convert to chat messages with the SDK's own ``Converter.items_to_messages`` (what
the SDK does for Chat Completions models), keep the leading system message, then
walk newest-first with the cl100k formula and stop at the first message that does
not fit. Message-level trimming knows nothing about tool pairs.
"""

from __future__ import annotations

from typing import Any, ClassVar

from benchmarks.systems.base import Msg, SkipSystem, System, package_version

__all__ = ["AgentsSystem", "to_items"]


def to_items(m: Msg, n: int) -> list[dict[str, Any]]:
    """An OpenAI chat dict as the Responses input items the SDK stores (``n``: an id)."""
    role = m["role"]
    content = m.get("content")
    if role in ("system", "developer", "user"):
        return [{"role": role, "content": content}]
    if role == "tool":
        return [{"type": "function_call_output", "call_id": m["tool_call_id"], "output": content}]
    items: list[dict[str, Any]] = []
    if content:
        items.append(
            {
                "id": f"msg_{n:08d}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": content, "annotations": []}],
            }
        )
    for c in m.get("tool_calls") or ():
        items.append(
            {
                "id": f"fc_{c['id']}",
                "type": "function_call",
                "call_id": c["id"],
                "name": c["function"]["name"],
                "arguments": c["function"]["arguments"],
                "status": "completed",
            }
        )
    return items


class AgentsSystem(System):
    """``SQLAlchemySession`` (async engine) + newest-first trimming."""

    name: ClassVar[str] = "openai-agents"
    label: ClassVar[str] = "OpenAI Agents SDK SQLAlchemySession + trim"
    is_async: ClassVar[bool] = True
    import_chunk_size: ClassVar[int] = 5_000
    import_path: ClassVar[str] = "add_items (one call per 5,000 messages)"

    @staticmethod
    def versions() -> str:
        return package_version("openai-agents")

    def setup(self) -> None:
        try:
            from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
            from agents.models.chatcmpl_converter import Converter
        except ImportError as exc:
            raise SkipSystem(f"openai-agents is not installed: {exc}") from exc
        from sqlalchemy.ext.asyncio import create_async_engine

        self.Session = SQLAlchemySession
        self.Converter = Converter
        self.engine = create_async_engine(self.db.url(asyncio_driver=True))
        self.sessions: dict[str, Any] = {}
        self.n = 0

    def close(self) -> None:
        self.run(self.engine.dispose())

    def session(self, cid: str) -> Any:
        """The session object of ``cid`` (shared engine)."""
        s = self.sessions.get(cid)
        if s is None:
            s = self.sessions[cid] = self.Session(cid, engine=self.engine, create_tables=True)
        return s

    def _items(self, msgs: list[Msg]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in msgs:
            self.n += 1
            out.extend(to_items(m, self.n))
        return out

    async def aimport_chunk(self, cid: str, chunk: list[Msg], *, main: bool) -> None:
        await self.session(cid).add_items(self._items(chunk))

    async def afetch(self, cid: str, prepared: Any) -> Any:
        items = await self.session(cid).get_items()
        messages = self.Converter.items_to_messages(items)
        return trim_newest_first(messages, prepared.budget, self.ctx.formula)

    def to_openai(self, native: Any) -> list[Msg]:
        return [dict(m) for m in native]

    async def aappend(self, cid: str, message: Msg) -> None:
        await self.session(cid).add_items(self._items([message]))


def trim_newest_first(messages: list[Any], budget: int, formula: Any) -> list[Any]:
    """Keep a leading system message, then the newest messages that fit ``budget``."""
    head: list[Any] = []
    rest = messages
    if messages and messages[0]["role"] in ("system", "developer"):
        head, rest = [messages[0]], messages[1:]
    left = budget - formula.priming - sum(formula.count(m) for m in head)
    kept: list[Any] = []
    for m in reversed(rest):
        c = formula.count(m)
        if c > left:
            break
        left -= c
        kept.append(m)
    kept.reverse()
    return head + kept
