"""What ``CompiledContext.to_openai()`` sends must be a valid Chat Completions request.

``cache_control`` is an Anthropic field: no Chat Completions content part has it (the
openai SDK's request types are generated from OpenAI's API spec, so their keys are the
accepted ones), and strict endpoints refuse it. The default output leaves it out;
``to_openai(cache_control=True)`` is the opt-in form for Anthropic-compatible gateways.
(This lives beside the token tests because the builder's own test file belongs to
another change; it tests memstore/context/builder.py.)
"""

from __future__ import annotations

import json
import typing
from typing import Any

from memstore import Block, ContextBuilder, Drop, FixedCounter, Message, Strict, Tier
from memstore.models import TextPart, ToolCall

C = FixedCounter(per_message=1, per_word=1)
EPHEMERAL = {"type": "ephemeral"}


def compiled() -> Any:
    system = Block("s", tier=Tier.SYSTEM, strategy=Strict(), cache_control=EPHEMERAL,
                   messages=[Message.system("intro"), Message.system("rules")])
    parts = Block("p", tier=1, strategy=Drop(), cache_control=EPHEMERAL,
                  messages=[Message.user([TextPart(text="a"), TextPart(text="b")])])
    calls = Block("t", tier=2, strategy=Drop(), cache_control=EPHEMERAL, messages=[
        Message.assistant(None, tool_calls=[ToolCall(id="c1", name="f", arguments="{}")])])
    builder = ContextBuilder(100, counter=C).add_block(system).add_block(parts)
    return builder.add_block(calls).compile()


def _allowed_part_keys() -> dict[str, set[str]]:
    """Content-part keys the openai SDK's Chat Completions request types define."""
    from openai.types.chat import (
        ChatCompletionContentPartImageParam,
        ChatCompletionContentPartTextParam,
    )

    return {
        "text": set(typing.get_type_hints(ChatCompletionContentPartTextParam)),
        "image_url": set(typing.get_type_hints(ChatCompletionContentPartImageParam)),
    }


def test_default_output_has_no_cache_control() -> None:
    out = compiled().to_openai()
    assert "cache_control" not in json.dumps(out)
    assert out[:2] == [{"role": "system", "content": "intro"},
                       {"role": "system", "content": "rules"}]
    assert out[2]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    allowed = _allowed_part_keys()
    assert allowed["text"] == {"type", "text"}
    for message in out:
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            assert set(part) <= allowed[part["type"]], part


def test_default_output_is_each_message_as_openai_renders_it() -> None:
    result = compiled()
    assert result.to_openai() == [m.to_openai() for m in result.messages]
    assert result.to_openai() == result.to_openai(cache_control=False)


def test_cache_control_for_gateways_is_opt_in() -> None:
    out = compiled().to_openai(cache_control=True)
    assert out[1] == {"role": "system", "content": [
        {"type": "text", "text": "rules", "cache_control": EPHEMERAL}]}
    assert out[2]["content"][-1] == {"type": "text", "text": "b", "cache_control": EPHEMERAL}
    assert "cache_control" not in json.dumps(out[3])  # a tool call has no content to mark
