"""Shared builders for the unit and view tests.

Messages are written with short constructors (``S()``, ``U("u1")``, ``CALL("c1")``,
``RES("c1")`` ...) and turned into one conversation's stored messages by
:func:`stored`; :func:`labels` turns a window back into short labels so tests can
compare against golden vectors written like the reference notes'.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from memstore.models import Message, StoredMessage, ToolCall
from memstore.tokens import FixedCounter, TokenCounter
from memstore.views.window import ContextWindow

#: Counts messages: every message is 1 token, no priming.
PER_MESSAGE = FixedCounter(1)
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def S(text: str = "S", **kw: Any) -> Message:
    return Message.system(text, **kw)


def D(text: str = "D", **kw: Any) -> Message:
    return Message.developer(text, **kw)


def U(text: str, **kw: Any) -> Message:
    return Message.user(text, **kw)


def A(text: str, **kw: Any) -> Message:
    return Message.assistant(text, **kw)


def CALL(*ids: str, **kw: Any) -> Message:
    return Message.assistant(None, tool_calls=[ToolCall(id=i, name="f") for i in ids], **kw)


def RES(call_id: str, text: str | None = None, **kw: Any) -> Message:
    return Message.tool(text if text is not None else f"RES {call_id}", tool_call_id=call_id,
                        **kw)


def stored(
    messages: Iterable[Message],
    *,
    counter: TokenCounter = PER_MESSAGE,
    conversation_id: str = "conv",
    start: int = 1,
    times: Sequence[datetime] | None = None,
) -> list[StoredMessage]:
    """Store ``messages`` as one conversation: seqs from ``start``, counts from ``counter``."""
    out = []
    for i, m in enumerate(messages):
        out.append(
            StoredMessage(
                **m.model_dump(exclude={"id"}),
                id=f"m{start + i}",
                conversation_id=conversation_id,
                seq=start + i,
                created_at=times[i] if times is not None else T0 + timedelta(seconds=i),
                token_count=counter.count_message(m),
                token_counter=counter.name,
            )
        )
    return out


def label(m: Message) -> str:
    if m.tool_calls:
        return "CALL " + ",".join(m.tool_call_ids)
    if m.metadata.get("memstore") and not isinstance(m, StoredMessage):
        return f"<{m.text}>"
    return m.text


def labels(window: ContextWindow) -> list[str]:
    return [label(m) for m in window.messages]
