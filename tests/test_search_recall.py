"""The recall block: a search of the store as a builder block (budget, ranking, skip, report)."""

from __future__ import annotations

from typing import Any

import pytest

from memstore.context.builder import (
    Block,
    ContextBuilder,
    Drop,
    HistoryBlock,
    Recall,
    Strict,
    Tier,
    TruncateOldest,
)
from memstore.context.formatters import XMLFormatter
from memstore.errors import ConfigurationError, ContextBudgetError, InvalidInputError
from memstore.models import Message
from memstore.tokens import FixedCounter
from tests.helpers import call

COUNTER = FixedCounter(per_message=3, per_word=1, per_tool_call=2, priming=3)


async def remember(store: Any) -> None:
    """An old conversation about a dog, and the current one asking about it."""
    await call(store.extend("old", [
        Message.user("My dog is called Biscuit and she is a beagle."),     # 1
        Message.assistant("Biscuit is a lovely name for a beagle dog."),    # 2
        Message.user("The weather was rainy all week."),                   # 3
        Message.user("Biscuit the dog loves the park."),                   # 4
    ]))
    await call(store.extend("now", [
        *[Message.user(f"small talk {i}") for i in range(6)],
        Message.user("Remind me: what is my dog called?"),                 # 7
    ]))


async def compile_(builder: ContextBuilder, store: Any) -> Any:
    if hasattr(store, "setup"):  # an AsyncMemoryStore
        return await builder.acompile()
    return builder.compile()


def builder_for(store: Any, max_tokens: int = 400, *, strategy: Any = None,
                **recall: Any) -> ContextBuilder:
    builder = ContextBuilder(max_tokens, counter=COUNTER)
    builder.add_block(Block("system", tier=Tier.SYSTEM, strategy=Strict(),
                            messages=[Message.system("You are helpful.")]))
    builder.add_block(Block("memory", tier=Tier.RAG, strategy=strategy or TruncateOldest(),
                            recall=Recall(store, recall.pop("query", "dog"), **recall)))
    builder.add_block(Block("history", tier=Tier.HISTORY, strategy=TruncateOldest(),
                            history=HistoryBlock(store, "now")))
    return builder


async def test_hits_become_one_system_message(store: Any) -> None:
    await remember(store)
    compiled = await compile_(builder_for(store, context=0), store)
    memory = compiled.messages[1]
    assert memory.role == "system"
    lines = memory.text.splitlines()
    assert lines[0].startswith("### Recalled")
    assert len(lines) == 1 + 4  # old 1, 2, 4 and now 7
    assert all(" user: " in line or " assistant: " in line for line in lines[1:])
    assert lines[1][2:6].isdigit()  # "- 2026-..."
    assert "Biscuit" in memory.text
    report = compiled.report.recall_reports["memory"]
    assert set(report.hits) == {("old", 1), ("old", 2), ("old", 4), ("now", 7)}
    assert report.found == 4 and report.context == []
    assert compiled.token_count == COUNTER.count_messages(compiled.messages) <= 400


async def test_context_messages_are_shown_once(store: Any) -> None:
    await remember(store)
    compiled = await compile_(builder_for(store, context=1, conversation_id="old"), store)
    report = compiled.report.recall_reports["memory"]
    shown = report.hits + report.context
    assert len(shown) == len(set(shown))
    assert ("old", 3) in report.context  # the neighbour of hit 4 (and of hit 2)
    assert compiled.messages[1].text.count("rainy") == 1


async def test_skip_leaves_out_what_the_history_block_shows(store: Any) -> None:
    await remember(store)
    compiled = await compile_(builder_for(store, skip="history"), store)
    history = compiled.report.history_reports["history"]
    assert history.included_count == 7
    report = compiled.report.recall_reports["memory"]
    assert ("now", 7) not in report.hits + report.context
    assert report.skipped == 1
    assert compiled.messages[1].text.count("what is my dog called") == 0
    assert compiled.messages[-1].text == "Remind me: what is my dog called?"
    assert compiled.token_count == COUNTER.count_messages(compiled.messages)


async def test_skip_of_a_history_block_served_first(store: Any) -> None:
    await remember(store)
    builder = ContextBuilder(400, counter=COUNTER)
    builder.add_block(Block("history", tier=Tier.CORE, strategy=TruncateOldest(),
                            history=HistoryBlock(store, "now")))
    builder.add_block(Block("memory", tier=Tier.RAG, strategy=TruncateOldest(),
                            recall=Recall(store, "dog", skip="history", context=0)))
    compiled = await compile_(builder, store)
    report = compiled.report.recall_reports["memory"]
    assert set(report.hits) == {("old", 1), ("old", 2), ("old", 4)}
    assert report.skipped == 1


async def test_a_skipped_history_that_shows_everything_empties_the_block(store: Any) -> None:
    await call(store.extend("now", [Message.user("dog one"), Message.user("dog two")]))
    compiled = await compile_(builder_for(store, skip="history"), store)
    assert [m.text for m in compiled.messages] == ["You are helpful.", "dog one", "dog two"]
    assert compiled.report.recall_reports["memory"].hits == []
    assert compiled.report.tokens_per_block["memory"] == 0
    assert compiled.report.remaining_tokens == 400 - COUNTER.count_messages(compiled.messages)


async def test_over_budget_the_lowest_ranked_hits_go_first(store: Any) -> None:
    await remember(store)
    full = await compile_(builder_for(store, context=0, conversation_id="old"), store)
    ranked = full.report.recall_reports["memory"].hits
    assert len(ranked) == 3
    tight = builder_for(store, context=0, conversation_id="old")
    tight.remove_block("memory")
    budget = full.report.tokens_per_block["memory"] - 1
    tight.add_block(Block("memory", tier=Tier.RAG, strategy=TruncateOldest(), max_tokens=budget,
                          recall=Recall(store, "dog", conversation_id="old", context=0)))
    compiled = await compile_(tight, store)
    report = compiled.report.recall_reports["memory"]
    assert report.hits == ranked[:2] and report.dropped == 1
    assert compiled.report.evictions["memory"] == "truncated"
    assert compiled.report.tokens_per_block["memory"] <= budget


async def test_strict_raises_and_drop_drops(store: Any) -> None:
    await remember(store)
    for strategy, outcome in ((Strict(), "raise"), (Drop(), "drop")):
        builder = ContextBuilder(400, counter=COUNTER)
        builder.add_block(Block("memory", tier=Tier.RAG, strategy=strategy, max_tokens=20,
                                recall=Recall(store, "dog", context=0)))
        if outcome == "raise":
            with pytest.raises(ContextBudgetError, match="Strict"):
                await compile_(builder, store)
        else:
            compiled = await compile_(builder, store)
            assert compiled.messages == []
            assert compiled.report.blocks_dropped == ["memory"]
            assert compiled.report.evictions["memory"] == "dropped"


async def test_the_formatter_is_the_callers(store: Any) -> None:
    await remember(store)
    compiled = await compile_(builder_for(store, context=0, conversation_id="old",
                                          formatter=XMLFormatter("memory", "hit")), store)
    text = compiled.messages[1].text
    assert text.startswith("<memory>\n  <hit>") and text.endswith("</memory>")
    assert text.count("<hit>") == 3


async def test_no_hits_is_an_empty_block(store: Any) -> None:
    await remember(store)
    compiled = await compile_(builder_for(store, query="platypus"), store)
    assert [m.text for m in compiled.messages][:1] == ["You are helpful."]
    assert compiled.report.recall_reports["memory"].found == 0
    assert "memory" not in compiled.report.tokens_per_block


async def test_an_async_store_needs_acompile(store: Any) -> None:
    if not hasattr(store, "setup"):
        pytest.skip("the sync store compiles either way")
    await remember(store)
    builder = ContextBuilder(400, counter=COUNTER)
    builder.add_block(Block("memory", tier=Tier.RAG, strategy=TruncateOldest(),
                            recall=Recall(store, "dog")))
    with pytest.raises(ConfigurationError, match="acompile"):
        builder.compile()
    assert (await builder.acompile()).report.recall_reports["memory"].hits


def test_bad_recall_blocks_are_refused() -> None:
    class Store:
        def search(self, query: str, **kwargs: Any) -> list[Any]:
            return []

    with pytest.raises(ConfigurationError, match="Recall needs"):
        Recall(object(), "x")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="nothing to search for"):
        Recall(Store(), "  ")
    for field, value in (("limit", 0), ("limit", 1001), ("context", -1), ("context", 51),
                         ("skip", ""), ("formatter", 3)):
        with pytest.raises(ConfigurationError, match=field):
            Recall(Store(), "x", **{field: value})
    with pytest.raises(ConfigurationError, match="exactly one"):
        Block("b", tier=1, strategy=Strict(), recall=Recall(Store(), "x"),
              messages=[Message.user("x")])
    with pytest.raises(ConfigurationError, match="must be a Recall"):
        Block("b", tier=1, strategy=Strict(), recall="x")  # type: ignore[arg-type]
    builder = ContextBuilder(100, counter=COUNTER)
    builder.add_block(Block("memory", tier=1, strategy=Strict(),
                            recall=Recall(Store(), "x", skip="nowhere")))
    with pytest.raises(ConfigurationError, match="not a history block"):
        builder.compile()
