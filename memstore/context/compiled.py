"""The builder's results: the compiled context and the report of what it kept and left out.

[`CompiledContext`][memstore.CompiledContext] is what
[`ContextBuilder.compile()`][memstore.ContextBuilder.compile] returns: the messages, their
token count and a [`CompileReport`][memstore.CompileReport]; it renders the messages for
OpenAI's Chat Completions or Anthropic's Messages API, with the cache breakpoints that
blocks stamp (`stamp_cache_control`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from memstore._validate import check_flag
from memstore.context.recall import RecallReport
from memstore.formats import to_anthropic
from memstore.models import Message
from memstore.views.window import WindowReport

__all__ = ["CompileReport", "CompiledContext", "stamp_cache_control"]

_REPORT = ConfigDict(frozen=True, arbitrary_types_allowed=True)


class CompileReport(BaseModel):
    """What a compile kept, evicted and dropped, with the token arithmetic.

    ``total_tokens_used = priming + Σ tokens_per_block`` (priming even when the
    output is empty) ``= counter.count_messages(messages)`` and
    ``remaining_tokens = max_tokens - total_tokens_used``.

    Attributes:
        total_tokens_used: the output's tokens, reply priming included.
        remaining_tokens: ``max_tokens - total_tokens_used``.
        original_tokens: ``Σ original_tokens_per_block``.
        original_tokens_per_block: block id → tokens before eviction (for a history
            block: the tokens its view returned; the rest of the conversation is
            never read). Empty blocks are skipped and not listed.
        tokens_per_block: block id → tokens in the output (0 for a dropped block).
        evictions: block id → ``"dropped"``, ``"truncated"``, ``"summarized"`` or
            ``"evicted"`` (custom strategies); only blocks whose strategy was applied.
        blocks_dropped: ids of blocks left out whole by their strategy, in serving
            order, no repeats.
        history_reports: history block id → the ``WindowReport`` of the view that
            read it (``rows_read`` is the cost).
        recall_reports: recall block id → its
            [`RecallReport`][memstore.context.recall.RecallReport]: the conversation ids and
            seqs of the hits (and context) it showed, and what it left out.
    """

    model_config = _REPORT

    total_tokens_used: int
    remaining_tokens: int
    original_tokens: int
    original_tokens_per_block: dict[str, int] = Field(default_factory=dict)
    tokens_per_block: dict[str, int] = Field(default_factory=dict)
    evictions: dict[str, str] = Field(default_factory=dict)
    blocks_dropped: list[str] = Field(default_factory=list)
    history_reports: dict[str, WindowReport] = Field(default_factory=dict)
    recall_reports: dict[str, RecallReport] = Field(default_factory=dict)


def _cache_control_of(message: Message) -> Mapping[str, Any] | None:
    own = message.metadata.get("memstore")
    if isinstance(own, Mapping):
        control = own.get("cache_control")
        if isinstance(control, Mapping):
            return control
    return None


class CompiledContext(BaseModel):
    """The builder's output: the messages to send, their tokens and the report.

    Attributes:
        messages: blocks in serving order (tier, then insertion), each block's
            messages in their order.
        token_count: ``counter.count_messages(messages)`` (reply priming included).
        max_tokens: the builder's budget.
        report: the [`CompileReport`][memstore.CompileReport].
    """

    model_config = _REPORT

    messages: list[Message]
    token_count: int
    max_tokens: int
    report: CompileReport

    def to_openai(self, *, cache_control: bool = False) -> list[dict[str, Any]]:
        """Return the messages as OpenAI Chat Completions message dicts.

        By default the output is what OpenAI's Chat Completions API accepts: a block's
        ``cache_control`` is left out. It is an Anthropic field that no Chat
        Completions content part has (the API's text part is ``{"type", "text"}``
        only; OpenAI caches prompt prefixes on its own), and endpoints that validate
        request objects strictly refuse unknown fields with a 400 (reported: Azure
        OpenAI's "Unrecognized request argument supplied: cache_control", Chat
        Completions' "Additional properties are not allowed ... - 'messages.0'" on
        older models, the Responses API's "Unknown parameter:
        'input[0].content[0].cache_control'"); LiteLLM strips it before calling
        OpenAI for that reason.

        ``cache_control=True`` renders a stamped message's content as text parts with
        ``cache_control`` on the last one, the form Anthropic-compatible gateways
        (OpenRouter, LiteLLM) read; send that only to such a gateway. A stamped
        message without content (a tool call) is rendered plainly either way.
        """
        cache_control = check_flag(cache_control, "cache_control")
        out: list[dict[str, Any]] = []
        for m in self.messages:
            item = m.to_openai()
            control = _cache_control_of(m) if cache_control else None
            content = item.get("content")
            if control is not None and content:
                parts = [{"type": "text", "text": content}] if isinstance(content, str) else [
                    dict(part) for part in content
                ]
                parts[-1]["cache_control"] = json.loads(json.dumps(dict(control)))
                item["content"] = parts
            out.append(item)
        return out

    def to_anthropic(self) -> dict[str, Any]:
        """Return ``{"system": [...], "messages": [...]}`` for the Anthropic Messages API.

        A block's ``cache_control`` lands on the last content block of its last
        message. See `memstore.formats.to_anthropic()`.
        """
        return to_anthropic(self.messages)

    def __len__(self) -> int:
        return len(self.messages)


def stamp_cache_control(message: Message, control: Mapping[str, JsonValue]) -> Message:
    """A copy of ``message`` whose metadata carries ``{"memstore": {"cache_control": ...}}``."""
    metadata = dict(message.metadata)
    own = metadata.get("memstore")
    ours = dict(own) if isinstance(own, Mapping) else {}
    ours["cache_control"] = json.loads(json.dumps(dict(control)))
    metadata["memstore"] = ours
    return message.model_copy(update={"metadata": metadata})
