"""LlamaIndex: ``SQLAlchemyChatStore`` + ``Memory`` (token_limit = budget).

``Memory`` manages its window at *write* time: each ``aput`` re-reads every active
row, re-tokenizes it and archives the oldest when the total passes
``token_limit x chat_history_token_ratio`` (0.7, the default, kept here). ``aget``
returns every active row. Its tokenizer is LlamaIndex's default (tiktoken cl100k,
text only: no per-message overhead, tool-call blocks not counted).

Consequences for the harness, as a LlamaIndex user would live with them:

* A ``Memory`` has one ``token_limit``, and row status is per row, so each budget
  needs its own session: the main conversation is stored once per budget
  (``bench-main@4000``, ``bench-main@32000``).
* ``Memory`` archives a system message like any other, so the system prompt lives
  in the application (as ``FunctionAgent(system_prompt=...)`` does) and is prepended
  to the window, not stored.
* Building a long history: the bulk path (``add_messages``) writes the old part as
  ``archived``; the last ~1.5x budget of tokens go through ``Memory.aput_messages``
  in chunks of 32, so ``Memory``'s own queue logic decides the active window, as it
  would have after per-message puts.
* Appends go to the 4,000-token session with ``Memory.aput``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from benchmarks.systems.base import Msg, SkipSystem, System, package_version

__all__ = ["LlamaIndexSystem"]

_TAIL_CHUNK = 32
_ARCHIVE_BATCH = 2_000
_OTHER_ACTIVE = 20


class LlamaIndexSystem(System):
    """``SQLAlchemyChatStore`` + ``Memory``."""

    name: ClassVar[str] = "llamaindex"
    label: ClassVar[str] = "LlamaIndex SQLAlchemyChatStore + Memory"
    is_async: ClassVar[bool] = True
    import_chunk_size: ClassVar[int] = 2_000
    import_path: ClassVar[str] = (
        "add_messages(status=archived) for old rows + Memory.aput_messages for the last "
        "~1.5x budget tokens; main conversation stored once per budget"
    )

    @staticmethod
    def versions() -> str:
        return package_version("llama-index-core")

    def setup(self) -> None:
        try:
            from llama_index.core.base.llms.types import ChatMessage
            from llama_index.core.memory import Memory
            from llama_index.core.storage.chat_store.base_db import MessageStatus
            from llama_index.core.storage.chat_store.sql import SQLAlchemyChatStore
        except ImportError as exc:
            raise SkipSystem(f"llama-index-core is not installed: {exc}") from exc
        self.ChatMessage = ChatMessage
        self.Memory = Memory
        self.Status = MessageStatus
        self.store = SQLAlchemyChatStore(
            table_name="llama_index_memory",
            async_database_uri=self.db.url(asyncio_driver=True),
        )
        self.budgets = tuple(self.ctx.budgets)
        self.main_copies = len(self.budgets)
        self.memories: dict[str, Any] = {}
        self.held: dict[str, list[Any]] = {}
        self.system_message = self.to_chat(self.ctx.system_prompt)

    def close(self) -> None:
        engine = getattr(self.store, "_async_engine", None)
        if engine is not None:
            self.run(engine.dispose())

    def memory(self, key: str, budget: int) -> Any:
        """The ``Memory`` of session ``key`` (token_limit = ``budget``)."""
        mem = self.memories.get(key)
        if mem is None:
            mem = self.memories[key] = self.Memory.from_defaults(
                session_id=key, token_limit=budget, chat_store=self.store
            )
        return mem

    def to_chat(self, m: Msg) -> Any:
        """An OpenAI chat dict as a LlamaIndex ``ChatMessage`` (OpenAI-style kwargs)."""
        kwargs: dict[str, Any] = {}
        if m.get("tool_calls"):
            kwargs["tool_calls"] = m["tool_calls"]
        if m.get("tool_call_id"):
            kwargs["tool_call_id"] = m["tool_call_id"]
        return self.ChatMessage(role=m["role"], content=m.get("content"), additional_kwargs=kwargs)

    # ---- import ---------------------------------------------------------------------

    def _keys(self, cid: str, main: bool) -> list[tuple[str, int | None]]:
        if main:
            return [(f"{cid}@{b}", b) for b in self.budgets]
        return [(cid, None)]

    async def aimport_chunk(self, cid: str, chunk: list[Msg], *, main: bool) -> None:
        msgs = [self.to_chat(m) for m in chunk if m["role"] != "system"]
        for key, budget in self._keys(cid, main):
            held = self.held.setdefault(key, [])
            held.extend(msgs)
            # Hold back the newest rows: ~1.5x the budget in tokens (chars/4) for a
            # Memory session, the last 20 rows for a background conversation.
            if budget is None:
                cut = max(0, len(held) - _OTHER_ACTIVE)
            else:
                want = int(budget * 1.5) * 4
                chars = 0
                cut = len(held)
                while cut > 0 and chars < want:
                    cut -= 1
                    chars += len(held[cut].content or "") + 40
            old, self.held[key] = held[:cut], held[cut:]
            for i in range(0, len(old), _ARCHIVE_BATCH):
                await self.store.add_messages(
                    key, old[i : i + _ARCHIVE_BATCH], status=self.Status.ARCHIVED
                )

    async def afinish_import(self, cid: str, *, main: bool) -> None:
        for key, budget in self._keys(cid, main):
            tail = self.held.pop(key, [])
            if budget is None:
                if tail:
                    await self.store.add_messages(key, tail, status=self.Status.ACTIVE)
                continue
            mem = self.memory(key, budget)
            for i in range(0, len(tail), _TAIL_CHUNK):
                await mem.aput_messages(tail[i : i + _TAIL_CHUNK])

    # ---- read / append --------------------------------------------------------------

    def prepare(self, cid: str, spec: Any) -> Any:
        if spec.budget not in self.budgets:
            raise SkipSystem(f"no LlamaIndex session for budget {spec.budget}")
        return self.memory(f"{cid}@{spec.budget}", spec.budget)

    async def afetch(self, cid: str, prepared: Any) -> Any:
        return [self.system_message, *await prepared.aget()]

    def to_openai(self, native: Any) -> list[Msg]:
        out: list[Msg] = []
        for msg in native:
            role = getattr(msg.role, "value", msg.role)
            m: Msg = {"role": role, "content": msg.content}
            kw = msg.additional_kwargs
            if kw.get("tool_calls"):
                m["tool_calls"] = kw["tool_calls"]
            if kw.get("tool_call_id"):
                m["tool_call_id"] = kw["tool_call_id"]
            out.append(m)
        return out

    async def aappend(self, cid: str, message: Msg) -> None:
        await self.memory(f"{cid}@{self.budgets[0]}", self.budgets[0]).aput(self.to_chat(message))
