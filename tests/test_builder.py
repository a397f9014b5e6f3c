"""ContextBuilder: contexty's behaviours, the contexty bugs not copied, history blocks."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from memstore import (
    Block,
    BufferedView,
    CompiledContext,
    ConfigurationError,
    ContextBudgetError,
    ContextBuilder,
    Drop,
    FixedCounter,
    HistoryBlock,
    InvalidInputError,
    MarkdownListFormatter,
    MemoryStore,
    Message,
    NotFoundError,
    ScoreBasedView,
    StoredMessage,
    Strategy,
    Strict,
    Summarize,
    SummaryView,
    TextPart,
    Tier,
    TokenCounter,
    TokenLimitedView,
    ToolCall,
    TruncateOldest,
    UnboundedView,
    XMLFormatter,
    inject_into_system,
)
from memstore.aio import AsyncMemoryStore
from tests.helpers import call

# 1 token per message + 1 per word, no priming: block sizes are easy to read.
C = FixedCounter(per_message=1, per_word=1)
# The same with reply priming, for the arithmetic that involves it.
CP = FixedCounter(per_message=1, per_word=1, priming=3)


def words(n: int, role: str = "user", **kwargs: Any) -> Message:
    """A message of ``n`` words: ``n + 1`` tokens under C."""
    text = " ".join(["w"] * n)
    if role == "system":
        return Message.system(text, **kwargs)
    if role == "developer":
        return Message.developer(text, **kwargs)
    if role == "assistant":
        return Message.assistant(text, **kwargs)
    return Message.user(text, **kwargs)


def call_unit(call_id: str, n: int = 1) -> list[Message]:
    """An assistant tool call and its result (2 + 1 + n tokens under C)."""
    return [
        Message.assistant(tool_calls=[ToolCall(id=call_id, name="lookup")]),
        Message.tool(" ".join(["r"] * n), tool_call_id=call_id),
    ]


def ids(compiled: CompiledContext) -> list[str]:
    return [m.text for m in compiled.messages]


def check_arithmetic(compiled: CompiledContext, counter: TokenCounter) -> None:
    report = compiled.report
    priming = counter.count_messages([])
    assert report.total_tokens_used == counter.count_messages(compiled.messages)
    assert report.total_tokens_used == compiled.token_count
    assert report.total_tokens_used == priming + sum(report.tokens_per_block.values())
    assert report.remaining_tokens == compiled.max_tokens - report.total_tokens_used
    assert report.original_tokens == sum(report.original_tokens_per_block.values())
    assert report.total_tokens_used <= compiled.max_tokens


# ---- contexty's documented behaviours we keep ---------------------------------------------


def test_blocks_are_served_in_tier_order() -> None:
    builder = ContextBuilder(100, counter=C)
    builder.add_block(Block("scratch", tier=Tier.SCRATCHPAD, strategy=Drop(),
                            messages=[Message.user("scratch")]))
    builder.add_block(Block("history", tier=Tier.HISTORY, strategy=Drop(),
                            messages=[Message.user("history")]))
    builder.add_block(Block("custom", tier=7, strategy=Drop(), messages=[Message.user("seven")]))
    builder.add_block(Block("rag", tier=Tier.RAG, strategy=Drop(), messages=[Message.user("rag")]))
    builder.add_block(Block("core", tier=Tier.CORE, strategy=Drop(),
                            messages=[Message.user("core")]))
    builder.add_block(Block("system", tier=Tier.SYSTEM, strategy=Strict(),
                            messages=[Message.system("system")]))
    builder.add_block(Block("first", tier=-1, strategy=Drop(), messages=[Message.user("minus")]))
    assert ids(builder.compile()) == [
        "minus", "system", "core", "rag", "history", "scratch", "seven",
    ]


def test_insertion_order_is_kept_within_a_tier() -> None:
    builder = ContextBuilder(100, counter=C)
    for name in ("b", "a", "c"):
        builder.add_block(Block(name, tier=Tier.RAG, strategy=Drop(),
                                messages=[Message.user(name)]))
    builder.add_block(Block("s", tier=Tier.SYSTEM, strategy=Strict(),
                            messages=[Message.system("s")]))
    assert ids(builder.compile()) == ["s", "b", "a", "c"]


def test_a_blocks_max_tokens_caps_it_only_when_below_what_remains() -> None:
    # 10 tokens of budget; the system block takes 4, so 6 remain.
    sys_block = Block("s", tier=Tier.SYSTEM, strategy=Strict(), messages=[words(3, "system")])
    history = [words(1), words(1), words(1)]  # 2 tokens each: 6 in all
    # A cap above what remains (100 > 6): the block gets 6 and fits whole.
    loose = ContextBuilder(10, counter=C).add_block(sys_block).add_block(
        Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(), messages=history, max_tokens=100))
    compiled = loose.compile()
    assert compiled.report.tokens_per_block == {"s": 4, "h": 6}
    assert "h" not in compiled.report.evictions
    # A cap below what remains (4 < 6): the block gets 4 and is truncated to 2 messages.
    tight = ContextBuilder(10, counter=C).add_block(sys_block).add_block(
        Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(), messages=history, max_tokens=4))
    compiled = tight.compile()
    assert compiled.report.tokens_per_block == {"s": 4, "h": 4}
    assert compiled.report.evictions == {"h": "truncated"}
    assert compiled.report.remaining_tokens == 2
    check_arithmetic(compiled, C)


def test_report_fields_and_their_arithmetic() -> None:
    builder = ContextBuilder(30, counter=CP)  # priming 3: 27 for the blocks
    builder.add_block(Block("system", tier=Tier.SYSTEM, strategy=Strict(),
                            messages=[words(4, "system")]))                     # 5
    builder.add_block(Block("rag", tier=Tier.RAG, strategy=Drop(),
                            messages=[words(30)]))                               # 31: dropped
    builder.add_block(Block("facts", tier=Tier.CORE, strategy=Drop(),
                            messages=[words(2), words(2)]))                      # 6
    builder.add_block(Block("history", tier=Tier.HISTORY, strategy=TruncateOldest(),
                            messages=[words(5), words(5), words(5)]))            # 18 → 12
    compiled = builder.compile()
    report = compiled.report
    assert report.original_tokens_per_block == {"system": 5, "facts": 6, "rag": 31, "history": 18}
    assert report.tokens_per_block == {"system": 5, "facts": 6, "rag": 0, "history": 12}
    assert report.evictions == {"rag": "dropped", "history": "truncated"}
    assert report.blocks_dropped == ["rag"]
    assert report.original_tokens == 60
    assert report.total_tokens_used == 3 + 5 + 6 + 12 == 26
    assert report.remaining_tokens == 4
    assert report.history_reports == {}
    check_arithmetic(compiled, CP)


def test_priming_is_charged_even_when_the_output_is_empty() -> None:
    builder = ContextBuilder(10, counter=CP).add_block(
        Block("rag", tier=Tier.RAG, strategy=Drop(), messages=[words(20)]))
    compiled = builder.compile()
    assert compiled.messages == []
    assert compiled.token_count == compiled.report.total_tokens_used == 3
    assert compiled.report.remaining_tokens == 7
    check_arithmetic(compiled, CP)


def test_strict_overflow_names_the_block_its_tokens_and_its_budget() -> None:
    builder = ContextBuilder(10, counter=CP).add_block(
        Block("persona", tier=Tier.SYSTEM, strategy=Strict(), messages=[words(9, "system")]))
    with pytest.raises(ContextBudgetError) as info:
        builder.compile()
    assert info.value.required == 10 and info.value.budget == 7
    assert "'persona'" in str(info.value) and "10" in str(info.value) and "7" in str(info.value)


def test_drop_leaves_the_block_out() -> None:
    builder = ContextBuilder(10, counter=C)
    builder.add_block(Block("a", tier=Tier.RAG, strategy=Drop(), messages=[words(3)]))
    builder.add_block(Block("b", tier=Tier.RAG, strategy=Drop(), messages=[words(9)]))
    builder.add_block(Block("c", tier=Tier.RAG, strategy=Drop(), messages=[words(2)]))
    compiled = builder.compile()
    assert [m.text for m in compiled.messages] == ["w w w", "w w"]
    assert compiled.report.blocks_dropped == ["b"]
    assert compiled.report.evictions == {"b": "dropped"}


def test_truncate_keeps_protected_roles_and_respects_min_messages() -> None:
    dev = words(2, "developer")                          # 3 tokens
    history = [words(1), words(1, "assistant"), dev, words(1), words(1, "assistant")]  # 11
    block = Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(protect_roles=("user",)),
                  messages=history)
    compiled = ContextBuilder(9, counter=C).add_block(block).compile()
    # The oldest assistant message goes; users and the developer are protected.
    assert [m.role for m in compiled.messages] == ["user", "developer", "user", "assistant"]
    # With min_messages above what would remain, the unprotected messages go and the
    # protected developer message stays: protected messages never vanish silently.
    block = Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(min_messages=4),
                  messages=history)
    compiled = ContextBuilder(6, counter=C).add_block(block).compile()
    assert compiled.messages == [dev]
    assert compiled.report.evictions == {"h": "truncated"}
    assert compiled.report.blocks_dropped == []
    assert compiled.report.tokens_per_block == {"h": 3}
    # With nothing protected in the block, it is dropped.
    plain = [words(1), words(1, "assistant"), words(1), words(1, "assistant")]
    block = Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(min_messages=4),
                  messages=plain)
    compiled = ContextBuilder(6, counter=C).add_block(block).compile()
    assert compiled.messages == []
    assert compiled.report.evictions == {"h": "truncated"}
    assert compiled.report.blocks_dropped == ["h"]
    assert compiled.report.tokens_per_block == {"h": 0}


def test_truncate_raises_when_only_protected_messages_are_left_even_with_min_messages() -> None:
    block = Block("h", tier=Tier.HISTORY,
                  strategy=TruncateOldest(min_messages=5),
                  messages=[words(6, "system"), words(1), words(1)])
    with pytest.raises(ContextBudgetError) as info:
        ContextBuilder(5, counter=C).add_block(block).compile()
    assert info.value.required == 7 and info.value.budget == 5
    assert "'h'" in str(info.value)


def test_summarize_replaces_the_block_with_its_summary() -> None:
    seen: list[list[Message]] = []

    def summarizer(messages: list[Message]) -> str:
        seen.append(messages)
        return "short summary"

    history = [words(5), words(5, "assistant"), words(5)]
    builder = ContextBuilder(10, counter=C).add_block(
        Block("h", tier=Tier.HISTORY, strategy=Summarize(summarizer), messages=history))
    compiled = builder.compile()
    assert seen == [history]
    assert compiled.messages == [Message.system("short summary")]
    assert compiled.report.evictions == {"h": "summarized"}
    assert compiled.report.tokens_per_block == {"h": 3}
    assert compiled.report.blocks_dropped == []


def test_summarize_falls_back_to_drop_when_the_summary_is_still_too_large() -> None:
    def summarizer(messages: list[Message]) -> Message:
        return words(20, "assistant")

    builder = ContextBuilder(10, counter=C).add_block(
        Block("h", tier=Tier.HISTORY, strategy=Summarize(summarizer), messages=[words(12)]))
    compiled = builder.compile()
    assert compiled.messages == []
    assert compiled.report.evictions == {"h": "summarized"}
    assert compiled.report.blocks_dropped == ["h"]


def test_summarizer_errors_propagate_and_bad_results_are_refused() -> None:
    def failing(messages: list[Message]) -> str:
        raise RuntimeError("LLM down")

    builder = ContextBuilder(5, counter=C).add_block(
        Block("h", tier=Tier.HISTORY, strategy=Summarize(failing), messages=[words(9)]))
    with pytest.raises(RuntimeError, match="LLM down"):
        builder.compile()

    builder = ContextBuilder(5, counter=C).add_block(
        Block("h", tier=Tier.HISTORY, strategy=Summarize(lambda ms: 42), messages=[words(9)]))  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigurationError, match="returned a int"):
        builder.compile()
    with pytest.raises(ConfigurationError):
        Summarize("not callable")  # type: ignore[arg-type]


async def test_async_summarizers_run_only_under_acompile() -> None:
    async def summarizer(messages: list[Message]) -> str:
        await asyncio.sleep(0)
        return f"{len(messages)} messages"

    builder = ContextBuilder(5, counter=C).add_block(
        Block("h", tier=Tier.HISTORY, strategy=Summarize(summarizer), messages=[words(9)] * 2))
    with pytest.raises(ConfigurationError, match="acompile"):
        builder.compile()
    compiled = await builder.acompile()
    assert compiled.messages == [Message.system("2 messages")]
    # A sync summarizer works under acompile too.
    sync_builder = ContextBuilder(5, counter=C).add_block(
        Block("h", tier=Tier.HISTORY, strategy=Summarize(lambda ms: "sync"), messages=[words(9)]))
    assert (await sync_builder.acompile()).messages == [Message.system("sync")]


class KeepFirst(Strategy):
    """A custom strategy: keep the first ``n`` messages, whatever they cost."""

    def __init__(self, n: int) -> None:
        self.n = n

    def apply(self, messages: list[Message], tokens: int, limit: int,
              counter: TokenCounter) -> list[Message]:
        return messages[: self.n]


def test_a_custom_strategy_that_overruns_is_refused() -> None:
    builder = ContextBuilder(10, counter=C).add_block(
        Block("x", tier=Tier.RAG, strategy=KeepFirst(1), messages=[words(20), words(1)]))
    with pytest.raises(ContextBudgetError, match="exceeded its budget") as info:
        builder.compile()
    assert "KeepFirst" in str(info.value) and "'x'" in str(info.value)
    assert info.value.required == 21 and info.value.budget == 10


def test_a_custom_strategy_within_budget_is_labelled_evicted() -> None:
    builder = ContextBuilder(10, counter=C)
    builder.add_block(Block("x", tier=Tier.RAG, strategy=KeepFirst(1),
                            messages=[words(2), words(20)]))
    builder.add_block(Block("y", tier=Tier.RAG, strategy=KeepFirst(0), messages=[words(20)]))
    compiled = builder.compile()
    assert [m.text for m in compiled.messages] == ["w w"]
    assert compiled.report.evictions == {"x": "evicted", "y": "evicted"}
    assert compiled.report.blocks_dropped == ["y"]


def test_empty_blocks_are_skipped() -> None:
    builder = ContextBuilder(10, counter=C)
    builder.add_block(Block("empty", tier=Tier.SYSTEM, strategy=Strict(), messages=[]))
    builder.add_block(Block("a", tier=Tier.RAG, strategy=Drop(), messages=[words(1)]))
    compiled = builder.compile()
    assert "empty" not in compiled.report.original_tokens_per_block
    assert "empty" not in compiled.report.tokens_per_block
    assert [m.text for m in compiled.messages] == ["w"]


def test_the_builder_is_reusable_and_deterministic() -> None:
    builder = ContextBuilder(12, counter=C)
    builder.add_block(Block("a", tier=Tier.RAG, strategy=Drop(), messages=[words(3)]))
    builder.add_block(Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(),
                            messages=[words(3), words(3), words(3)]))
    first, second = builder.compile(), builder.compile()
    assert first == second
    builder.add_block(Block("s", tier=Tier.SYSTEM, strategy=Strict(), messages=[words(1)]))
    third = builder.compile()
    assert third.messages[0].text == "w"
    assert third.report.tokens_per_block["h"] == 4
    builder.remove_block("s")
    assert builder.compile() == first
    assert [b.id for b in builder.blocks] == ["a", "h"]


def test_add_and_remove_chain() -> None:
    builder = (ContextBuilder(10, counter=C)
               .add_block(Block("a", tier=1, strategy=Drop(), messages=[words(1)]))
               .add_block(Block("b", tier=1, strategy=Drop(), messages=[words(1)]))
               .remove_block("a"))
    assert [b.id for b in builder.blocks] == ["b"]
    with pytest.raises(NotFoundError, match="'a'"):
        builder.remove_block("a")


# ---- contexty bugs we do not copy -----------------------------------------------------------


def test_duplicate_ids_are_refused_instead_of_overwriting_the_report() -> None:
    builder = ContextBuilder(10, counter=C).add_block(
        Block("a", tier=1, strategy=Drop(), messages=[words(1)]))
    with pytest.raises(ConfigurationError, match="'a'"):
        builder.add_block(Block("a", tier=2, strategy=Drop(), messages=[words(2)]))
    assert len(builder.blocks) == 1


def test_turn_atomic_truncation_never_leaves_an_orphan_tool_result() -> None:
    # contexty's KeepUserAssistantPairs removes a user+assistant pair and leaves the
    # tool result of the assistant's call behind.
    history = [words(1), *call_unit("c1"), words(1, "assistant"),   # turn 1: 2 + 3 + 2 = 7
               words(1), *call_unit("c2"), words(1, "assistant")]   # turn 2: 7
    for strategy in (TruncateOldest(keep_turns_atomic=True), TruncateOldest()):
        for limit in range(1, 15):
            builder = ContextBuilder(limit, counter=C).add_block(
                Block("h", tier=Tier.HISTORY, strategy=strategy, messages=history))
            kept = builder.compile().messages
            roles = [m.role for m in kept]
            for i, m in enumerate(kept):
                if m.role == "tool":
                    assert roles[i - 1] == "assistant" and kept[i - 1].tool_calls, (strategy, kept)
                if m.tool_calls:
                    assert i + 1 < len(kept) and kept[i + 1].role == "tool"
            if strategy.keep_turns_atomic and kept:
                assert kept[0].role == "user", (limit, kept)


def test_units_before_the_first_user_message_go_one_at_a_time() -> None:
    history = [words(1, "assistant"), words(1, "assistant"), words(1), words(1, "assistant")]
    builder = ContextBuilder(6, counter=C).add_block(
        Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(keep_turns_atomic=True),
              messages=history))
    assert [m.role for m in builder.compile().messages] == ["assistant", "user", "assistant"]


def test_truncation_never_removes_system_developer_or_pinned_messages() -> None:
    history = [words(1, "system"), words(1), words(1, pinned=True), words(1, "assistant"),
               words(1, "developer"), words(1), words(1, "assistant")]
    builder = ContextBuilder(10, counter=C).add_block(
        Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(), messages=history))
    kept = builder.compile().messages
    assert [m.role for m in kept] == ["system", "user", "developer", "user", "assistant"]
    assert kept[1].pinned


def test_a_pinned_or_protected_message_protects_its_whole_tool_unit() -> None:
    pinned_result = [Message.assistant(tool_calls=[ToolCall(id="c", name="f")]),
                     Message.tool("result", tool_call_id="c", pinned=True)]
    history = [words(3), *pinned_result, words(3), words(1)]
    builder = ContextBuilder(6, counter=C).add_block(
        Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(), messages=history))
    assert builder.compile().messages == [*pinned_result, words(1)]
    protect_tool = ContextBuilder(6, counter=C).add_block(
        Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(protect_roles=("tool",)),
              messages=[words(3), *call_unit("d"), words(3), words(1)]))
    assert [m.role for m in protect_tool.compile().messages] == ["assistant", "tool", "user"]


def test_blocks_dropped_never_repeats() -> None:
    builder = ContextBuilder(5, counter=C)
    for name in ("a", "b", "c"):
        builder.add_block(Block(name, tier=Tier.RAG, strategy=Drop(), messages=[words(9)]))
    for _ in range(2):
        assert builder.compile().report.blocks_dropped == ["a", "b", "c"]


def test_a_custom_strategy_is_checked_against_the_blocks_own_cap() -> None:
    # contexty compares the output with the global remainder (100 here), so a
    # strategy can blow through the block's own max_tokens.
    builder = ContextBuilder(100, counter=C).add_block(
        Block("x", tier=Tier.RAG, strategy=KeepFirst(1), messages=[words(9), words(9)],
              max_tokens=5))
    with pytest.raises(ContextBudgetError, match="exceeded its budget") as info:
        builder.compile()
    assert info.value.required == 10 and info.value.budget == 5


def test_a_custom_strategy_that_splits_a_tool_unit_is_refused() -> None:
    class DropFirst(Strategy):
        def apply(self, messages: list[Message], tokens: int, limit: int,
                  counter: TokenCounter) -> list[Message]:
            return messages[1:]

    builder = ContextBuilder(6, counter=C).add_block(
        Block("x", tier=Tier.RAG, strategy=DropFirst(), messages=[*call_unit("c", 9)]))
    with pytest.raises(ConfigurationError, match="split a tool unit"):
        builder.compile()

    class NotAList(Strategy):
        def apply(self, messages: list[Message], tokens: int, limit: int,
                  counter: TokenCounter) -> list[Message]:
            return "nope"  # type: ignore[return-value]

    builder = ContextBuilder(6, counter=C).add_block(
        Block("x", tier=Tier.RAG, strategy=NotAList(), messages=[words(9)]))
    with pytest.raises(ConfigurationError, match="list of Message"):
        builder.compile()


# ---- configuration errors --------------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [0, -1, True, 1.5, "10"])
def test_builder_max_tokens_must_be_a_positive_int(max_tokens: Any) -> None:
    with pytest.raises(ConfigurationError, match="max_tokens"):
        ContextBuilder(max_tokens, counter=C)


def test_builder_refuses_a_budget_below_priming_and_a_non_counter() -> None:
    with pytest.raises(ConfigurationError, match="priming"):
        ContextBuilder(2, counter=CP)
    with pytest.raises(ConfigurationError, match="TokenCounter"):
        ContextBuilder(10, counter="cl100k")  # type: ignore[arg-type]


def test_the_default_counter_is_offline_cl100k() -> None:
    builder = ContextBuilder(100)
    assert builder.counter.name == "tiktoken/cl100k_base"
    compiled = builder.add_block(
        Block("s", tier=Tier.SYSTEM, strategy=Strict(), messages=[Message.system("Hello")])
    ).compile()
    assert compiled.token_count == builder.counter.count_messages([Message.system("Hello")])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"strategy": None, "messages": []}, "no strategy"),
        ({"strategy": "drop", "messages": []}, "Strategy"),
        ({"strategy": Drop()}, "exactly one"),
        ({"strategy": Drop(), "messages": [], "max_tokens": 0}, "max_tokens"),
        ({"strategy": Drop(), "messages": [], "max_tokens": -3}, "max_tokens"),
        ({"strategy": Drop(), "messages": [{"role": "user", "content": "x"}]}, "not a Message"),
        ({"strategy": Drop(), "messages": "hello"}, "list of Message"),
        ({"strategy": Drop(), "messages": [], "cache_control": "ephemeral"}, "JSON object"),
        ({"strategy": Drop(), "messages": [], "cache_control": {"x": float("nan")}}, "JSON"),
        ({"strategy": Drop(), "messages": [], "tier": "high"}, "tier"),
        ({"strategy": Drop(), "messages": [], "history": "h"}, "exactly one"),
    ],
)
def test_invalid_blocks_raise_configuration_error_at_once(
    kwargs: dict[str, Any], match: str
) -> None:
    kwargs = {"tier": Tier.RAG, **kwargs}
    with pytest.raises(ConfigurationError, match=match):
        Block("b", **kwargs)


def test_block_ids_must_be_non_empty_strings() -> None:
    for bad in ("", None, 3):
        with pytest.raises(ConfigurationError, match="block id"):
            Block(bad, tier=1, strategy=Drop(), messages=[])  # type: ignore[arg-type]


def test_truncate_oldest_parameters_are_validated() -> None:
    with pytest.raises(ConfigurationError, match="min_messages"):
        TruncateOldest(min_messages=-1)
    with pytest.raises(ConfigurationError, match="keep_turns_atomic"):
        TruncateOldest(keep_turns_atomic=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="unknown role"):
        TruncateOldest(protect_roles=("robot",))
    with pytest.raises(ConfigurationError, match="sequence of roles"):
        TruncateOldest(protect_roles="user")  # type: ignore[arg-type]
    assert TruncateOldest(protect_roles=["user", "user"]).protect_roles == ("user",)  # type: ignore[arg-type]


def test_block_messages_are_snapshotted() -> None:
    messages = [words(1)]
    block = Block("b", tier=1, strategy=Drop(), messages=messages)
    messages.append(words(2))
    assert block.messages == (words(1),)


def test_strategies_are_small_frozen_objects() -> None:
    strategy = TruncateOldest(keep_turns_atomic=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        strategy.min_messages = 3  # type: ignore[misc]
    assert Strict() == Strict() and Drop() == Drop()


def test_built_in_strategies_apply_standalone() -> None:
    messages = [words(1, "system"), words(3), words(3)]
    assert TruncateOldest().apply(messages, 10, 6, C) == [words(1, "system"), words(3)]
    assert Drop().apply(messages, 10, 6, C) == []
    # the anchored system message stays; only the others are summarized, in their place
    given: list[list[Message]] = []
    summarize = Summarize(lambda ms: given.append(ms) or "s")
    assert summarize.apply(messages, 10, 6, C) == [words(1, "system"), Message.system("s")]
    assert given == [messages[1:]]
    with pytest.raises(ContextBudgetError):
        Strict().apply(messages, 10, 6, C)


def test_summarize_never_removes_anchored_messages() -> None:
    pinned = Message.user("fact " * 2, pinned=True)
    messages = [words(3), words(1, "system"), words(3), pinned, words(3)]
    given: list[list[Message]] = []

    def summarizer(ms: list[Message]) -> str:
        given.append(ms)
        return "sum"

    out = Summarize(summarizer).apply(messages, 30, 12, C)
    # the summary takes the place of the first message it stands for (the very first)
    assert out == [Message.system("sum"), words(1, "system"), pinned]
    assert given == [[messages[0], messages[2], messages[4]]]
    # a summary that does not fit next to them is left out; the anchored messages stay
    assert Summarize(lambda ms: "sum " * 20).apply(messages, 30, 12, C) == [
        words(1, "system"), pinned]
    # anchored messages over the budget on their own: a budget error naming the block
    with pytest.raises(ContextBudgetError, match="anchored messages"):
        Summarize(summarizer).apply(messages, 30, 3, C)
    # only anchored messages (that fit): nothing to summarize, the summarizer is not called
    given.clear()
    assert Summarize(summarizer).apply([words(1, "system"), pinned], 10, 9, C) == [
        words(1, "system"), pinned]
    assert given == []


# ---- cache_control ---------------------------------------------------------------------------


def test_cache_control_is_stamped_on_a_copy_of_the_last_output_message() -> None:
    system = Message.system("rules", metadata={"memstore": {"x": 1}, "mine": True})
    block = Block("s", tier=Tier.SYSTEM, strategy=Strict(),
                  messages=[Message.system("intro"), system],
                  cache_control={"type": "ephemeral"})
    compiled = ContextBuilder(20, counter=C).add_block(block).compile()
    last = compiled.messages[-1]
    assert last.metadata == {"memstore": {"x": 1, "cache_control": {"type": "ephemeral"}},
                             "mine": True}
    assert "cache_control" not in str(compiled.messages[0].metadata)
    assert block.messages is not None and block.messages[-1].metadata == system.metadata
    rendered = compiled.to_openai(cache_control=True)
    assert rendered[0] == {"role": "system", "content": "intro"}
    assert rendered[1] == {"role": "system", "content": [
        {"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}]}
    # plain OpenAI output by default: no content part of the Chat Completions API has it
    assert compiled.to_openai()[1] == {"role": "system", "content": "rules"}
    assert compiled.to_openai(cache_control=False)[1] == {"role": "system", "content": "rules"}


def test_cache_control_goes_on_the_last_block_output_after_truncation() -> None:
    block = Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(),
                  messages=[words(3), words(3), Message.user("last one")],
                  cache_control={"type": "ephemeral"})
    compiled = ContextBuilder(8, counter=C).add_block(block).compile()
    assert [m.text for m in compiled.messages] == ["w w w", "last one"]
    assert compiled.messages[-1].metadata["memstore"] == {"cache_control": {"type": "ephemeral"}}
    parts = compiled.to_openai(cache_control=True)[-1]["content"]
    assert parts[-1]["cache_control"] == {"type": "ephemeral"}
    multi = Block("m", tier=1, strategy=Drop(), cache_control={"type": "ephemeral"},
                  messages=[Message.user([TextPart(text="a"), TextPart(text="b")])])
    rendered = ContextBuilder(20, counter=C).add_block(multi).compile().to_openai(
        cache_control=True)
    assert rendered[0]["content"] == [{"type": "text", "text": "a"},
                                      {"type": "text", "text": "b",
                                       "cache_control": {"type": "ephemeral"}}]


# ---- formatters -------------------------------------------------------------------------------


def test_xml_formatter_escapes_special_characters() -> None:
    formatted = XMLFormatter()(["a < b & c", "</fact><x>'\""])
    assert formatted == (
        "<context>\n"
        "  <fact>a &lt; b &amp; c</fact>\n"
        "  <fact>&lt;/fact&gt;&lt;x&gt;&apos;&quot;</fact>\n"
        "</context>"
    )
    assert XMLFormatter(tag="docs", item_tag="doc")(["x"]) == "<docs>\n  <doc>x</doc>\n</docs>"
    for bad in ("", "1tag", "a b", "<x>"):
        with pytest.raises(ConfigurationError, match="XML name"):
            XMLFormatter(tag=bad)


def test_markdown_formatter_indents_continuation_lines() -> None:
    formatted = MarkdownListFormatter("Facts")(["one", "two\nlines\nhere", ""])
    assert formatted == "### Facts\n- one\n- two\n  lines\n  here\n- "
    assert MarkdownListFormatter("")(["x"]) == "- x"
    with pytest.raises(ConfigurationError):
        MarkdownListFormatter("two\nlines")


def test_inject_into_system_appends_one_text_part_and_keeps_the_rest() -> None:
    system = Message.system([TextPart(text="You are "), TextPart(text="helpful.")],
                            name="bot", metadata={"v": 2}, pinned=True)
    injected = inject_into_system(system, XMLFormatter(), ["fact <1>", Message.user("fact 2")])
    assert injected.role == "system" and injected.name == "bot"
    assert injected.metadata == {"v": 2} and injected.pinned
    assert injected.content == [
        TextPart(text="You are "), TextPart(text="helpful."),
        TextPart(text="\n<context>\n  <fact>fact &lt;1&gt;</fact>\n"
                      "  <fact>fact 2</fact>\n</context>"),
    ]
    plain = inject_into_system(Message.system("Rules."), MarkdownListFormatter("Docs"), ["d"])
    assert plain.text == "Rules.\n### Docs\n- d"
    assert inject_into_system(system, XMLFormatter(), []) is system


def test_inject_into_system_refuses_bad_input() -> None:
    with pytest.raises(InvalidInputError, match="system or developer"):
        inject_into_system(Message.user("x"), XMLFormatter(), ["a"])
    with pytest.raises(InvalidInputError, match="strings or Messages"):
        inject_into_system(Message.system("x"), XMLFormatter(), [3])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match="list"):
        inject_into_system(Message.system("x"), XMLFormatter(), "abc")
    with pytest.raises(InvalidInputError, match="not a string"):
        inject_into_system(Message.system("x"), lambda items: 3, ["a"])  # type: ignore[arg-type,return-value]


def test_inject_into_system_never_returns_a_stale_stored_count() -> None:
    from datetime import datetime, timezone

    stored = StoredMessage(role="system", content="rules", conversation_id="c", seq=1,
                           created_at=datetime.now(timezone.utc), token_count=2,
                           token_counter=C.name, id="m1")
    injected = inject_into_system(stored, XMLFormatter(), ["a fact"])
    assert type(injected) is Message and injected.id is None


# ---- history blocks (SQLite and PostgreSQL, sync and async stores) ---------------------------


def conversation(turns: int) -> list[Message]:
    """A system message, then user/assistant turns with a tool call every third turn."""
    out = [Message.system("You are a careful agent.")]
    for t in range(turns):
        out.append(Message.user(f"question {t} about the data"))
        if t % 3 == 0:
            out.append(Message.assistant(tool_calls=[ToolCall(id=f"c{t}", name="lookup")]))
            out.append(Message.tool(f"result {t}", tool_call_id=f"c{t}"))
        out.append(Message.assistant(f"answer {t} with some words"))
    return out


async def compile_with(builder: ContextBuilder, store: Any) -> CompiledContext:
    if isinstance(store, AsyncMemoryStore):
        return await builder.acompile()
    return builder.compile()


async def test_history_block_reads_a_window_sized_to_its_budget(store: Any) -> None:
    counter = store.counter
    await call(store.extend("chat", conversation(60)))
    builder = ContextBuilder(200, counter=counter)
    builder.add_block(Block("persona", tier=Tier.SYSTEM, strategy=Strict(),
                            messages=[Message.system("Be brief.")]))
    builder.add_block(Block("history", tier=Tier.HISTORY, strategy=TruncateOldest(),
                            history=HistoryBlock(store, "chat")))
    compiled = await compile_with(builder, store)
    check_arithmetic(compiled, counter)
    report = compiled.report
    budget = 200 - counter.count_messages([]) - report.tokens_per_block["persona"]
    window = await call(store.window(
        "chat", TokenLimitedView(token_limit=budget + counter.count_messages([]), counter=counter)))
    assert compiled.messages[1:] == window.messages
    assert report.tokens_per_block["history"] == sum(m.token_count for m in window.messages)
    assert report.original_tokens_per_block["history"] == report.tokens_per_block["history"]
    # The view left the older messages out for the budget: the block was truncated, and the
    # report says so (the view did it, oldest first, in O(window)).
    assert report.history_reports["history"].omitted[-1].reason == "budget"
    assert report.evictions == {"history": "truncated"}
    history_report = report.history_reports["history"]
    assert history_report.view == "TokenLimitedView"
    assert history_report.included_count == len(window.messages)
    assert history_report.rows_read < 80  # of 161 stored
    # The stored system message is anchored: it is in the window.
    assert compiled.messages[1].text == "You are a careful agent."
    # Reading a window never writes.
    assert (await call(store.get_conversation("chat"))).message_count == 161


async def test_history_block_keeps_the_views_own_settings(store: Any) -> None:
    counter = store.counter
    await call(store.extend("chat", conversation(20)))
    view = TokenLimitedView(token_limit=5, start_on_user=True, counter=FixedCounter(9))
    builder = ContextBuilder(120, counter=counter).add_block(
        Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(),
              history=HistoryBlock(store, "chat", view)))
    compiled = await compile_with(builder, store)
    non_system = [m for m in compiled.messages if m.role != "system"]
    assert non_system[0].role == "user"
    assert compiled.report.evictions == {"h": "truncated"}
    # The builder's counter replaced the view's own (stored counts are reused).
    assert compiled.report.history_reports["h"].counter == counter.name
    check_arithmetic(compiled, counter)


async def test_history_block_with_a_score_based_view_and_a_reserve(store: Any) -> None:
    counter = store.counter
    await call(store.extend("chat", conversation(30)))
    view = ScoreBasedView(token_limit=30, keep_rate=0.8, reserve=20)
    builder = ContextBuilder(150, counter=counter).add_block(
        Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(),
              history=HistoryBlock(store, "chat", view)))
    compiled = await compile_with(builder, store)
    check_arithmetic(compiled, counter)
    assert compiled.report.history_reports["h"].view == "ScoreBasedView"
    # The view leaves its reserve free inside the block's budget.
    assert compiled.report.tokens_per_block["h"] <= 150 - counter.count_messages([]) - 20
    # A reserve larger than the whole budget: the view reads its required part only
    # (anchored messages and the newest unit), which fits the block here.
    huge_reserve = ScoreBasedView(token_limit=500, reserve=400)
    tight = await compile_with(ContextBuilder(150, counter=counter).add_block(
        Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(),
              history=HistoryBlock(store, "chat", huge_reserve))), store)
    check_arithmetic(tight, counter)
    assert [m.text for m in tight.messages] == ["You are a careful agent.",
                                                   "answer 29 with some words"]
    assert tight.report.evictions == {"h": "truncated"}
    # Drop: the view left messages out for the budget, so the block did not fit.
    dropped = await compile_with(ContextBuilder(150, counter=counter).add_block(
        Block("h", tier=Tier.HISTORY, strategy=Drop(),
              history=HistoryBlock(store, "chat", huge_reserve))), store)
    assert dropped.messages == [] and dropped.report.blocks_dropped == ["h"]
    assert dropped.report.evictions == {"h": "dropped"}


async def test_history_block_of_an_unknown_conversation_is_empty(store: Any) -> None:
    builder = ContextBuilder(50, counter=store.counter).add_block(
        Block("h", tier=Tier.HISTORY, strategy=Strict(), history=HistoryBlock(store, "nobody")))
    compiled = await compile_with(builder, store)
    assert compiled.messages == []
    assert "h" not in compiled.report.original_tokens_per_block
    assert compiled.report.history_reports["h"].rows_read == 0
    assert compiled.report.history_reports["h"].conversation_message_count == 0


async def test_history_block_whose_required_part_does_not_fit(store: Any) -> None:
    counter = store.counter  # FixedCounter(per_message=3, per_word=1, per_tool_call=2, priming=3)
    await call(store.extend("chat", [Message.system("one two three four five six"),
                                     Message.user("a"), Message.assistant("b"),
                                     Message.user("the newest question is rather long")]))
    # system = 9, newest user = 9: the view needs 18 + priming; the block gets 12.
    def builder_with(strategy: Strategy) -> ContextBuilder:
        return ContextBuilder(15, counter=counter).add_block(
            Block("h", tier=Tier.HISTORY, strategy=strategy, history=HistoryBlock(store, "chat")))

    with pytest.raises(ContextBudgetError, match="'h'") as info:
        await compile_with(builder_with(Strict()), store)
    assert info.value.required == 18 and info.value.budget == 12

    dropped = await compile_with(builder_with(Drop()), store)
    assert dropped.messages == [] and dropped.report.blocks_dropped == ["h"]
    assert dropped.report.original_tokens_per_block == {"h": 18}
    assert dropped.report.history_reports["h"].included_count == 2

    # TruncateOldest keeps the newest unit (the question being answered) as it keeps
    # anchored messages: a request without it would answer nothing. They do not fit
    # together here: a budget error with the numbers, as a view gives.
    for strategy in (TruncateOldest(), TruncateOldest(min_messages=5)):
        with pytest.raises(ContextBudgetError, match="the newest unit") as info:
            await compile_with(builder_with(strategy), store)
        assert info.value.required == 18 and info.value.budget == 12
    # Summarize on a budgeted view is refused up front (see the test below).
    with pytest.raises(ConfigurationError, match="SummaryView"):
        builder_with(Summarize(lambda ms: "s"))

    # With room for both, Summarize folds the older messages and keeps the newest question.
    # (26 tokens of history in a 25-token block: system 9 + summary 5 + question 9 = 23 fit)
    roomy = ContextBuilder(28, counter=counter).add_block(Block(
        "h", tier=Tier.HISTORY, strategy=Summarize(lambda ms: f"{len(ms)} msgs"),
        history=HistoryBlock(store, "chat", BufferedView(10))))
    summarized = await compile_with(roomy, store)
    assert summarized.report.evictions == {"h": "summarized"}
    assert [m.text for m in summarized.messages] == [
        "one two three four five six", "2 msgs", "the newest question is rather long"]
    check_arithmetic(summarized, counter)


async def test_a_count_based_view_is_applied_then_trimmed(store: Any) -> None:
    counter = store.counter
    await call(store.extend("chat", conversation(10)))
    view = BufferedView(buffer_size=8)
    window = await call(store.window("chat", view))
    builder = ContextBuilder(400, counter=counter).add_block(
        Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(),
              history=HistoryBlock(store, "chat", view)))
    assert (await compile_with(builder, store)).messages == window.messages
    tight = ContextBuilder(45, counter=counter).add_block(
        Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(keep_turns_atomic=True),
              history=HistoryBlock(store, "chat", view)))
    compiled = await compile_with(tight, store)
    assert compiled.report.evictions == {"h": "truncated"}
    assert compiled.report.history_reports["h"].view == "BufferedView"
    kept = [m for m in compiled.messages if m.role != "system"]
    assert kept and kept[0].role == "user"
    assert kept == [m for m in window.messages if m.role != "system"][-len(kept):]
    check_arithmetic(compiled, counter)


async def test_the_store_kind_must_match_the_compile_call(store: Any) -> None:
    await call(store.append("chat", Message.user("hi")))
    builder = ContextBuilder(50, counter=store.counter).add_block(
        Block("h", tier=Tier.HISTORY, strategy=Strict(), history=HistoryBlock(store, "chat")))
    if isinstance(store, AsyncMemoryStore):
        with pytest.raises(ConfigurationError, match="acompile"):
            builder.compile()
    else:  # a sync store works under acompile too
        assert (await builder.acompile()).messages[0].text == "hi"


def test_history_block_arguments_are_validated(tmp_path: Any) -> None:
    with pytest.raises(ConfigurationError, match="MemoryStore"):
        HistoryBlock(object(), "chat")  # type: ignore[arg-type]
    with MemoryStore(f"sqlite:///{tmp_path / 'x.db'}", counter=C) as store:
        with pytest.raises(InvalidInputError, match="conversation id"):
            HistoryBlock(store, "")
        with pytest.raises(ConfigurationError, match="ContextView"):
            HistoryBlock(store, "chat", view="TokenLimitedView")  # type: ignore[arg-type]


@pytest.mark.slow
async def test_a_huge_history_reads_about_as_many_rows_as_a_small_one(db_url: str) -> None:
    counter = FixedCounter(per_message=3, per_word=1, per_tool_call=2, priming=3)
    batch = conversation(2000)[1:]  # 5,334 messages, without the system message
    rows: dict[tuple[str, str], int] = {}
    with MemoryStore(db_url, counter=counter) as sync_store:
        sync_store.append("small", Message.system("You are a careful agent."))
        sync_store.extend("small", batch[:999])
        sync_store.append("huge", Message.system("You are a careful agent."))
        stored = 1
        while stored < 100_000:
            chunk = batch[: min(len(batch), 100_000 - stored)]
            sync_store.extend("huge", chunk)
            stored += len(chunk)
        assert sync_store.get_conversation("huge").message_count == 100_000
        for cid in ("small", "huge"):
            builder = ContextBuilder(4_000, counter=counter).add_block(
                Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(),
                      history=HistoryBlock(sync_store, cid)))
            compiled = builder.compile()
            assert compiled.token_count <= 4_000
            rows[("sync", cid)] = compiled.report.history_reports["h"].rows_read
    async_store = AsyncMemoryStore(db_url, counter=counter)
    try:
        for cid in ("small", "huge"):
            builder = ContextBuilder(4_000, counter=counter).add_block(
                Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(),
                      history=HistoryBlock(async_store, cid)))
            compiled = await builder.acompile()
            assert compiled.token_count <= 4_000
            rows[("async", cid)] = compiled.report.history_reports["h"].rows_read
    finally:
        await async_store.close()
    for kind in ("sync", "async"):
        small, huge = rows[(kind, "small")], rows[(kind, "huge")]
        assert huge <= 2 * small + 64, rows
        assert huge < 2_000, rows


def test_the_builder_modules_are_pure() -> None:
    import ast
    from pathlib import Path

    import memstore

    package = Path(memstore.__file__).parent / "context"
    for module in ("builder.py", "strategies.py", "formatters.py"):
        tree = ast.parse((package / module).read_text())
        imported = {alias.name for node in ast.walk(tree)
                    if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}
        assert not {m.split(".")[0] for m in imported} & {"sqlalchemy", "tiktoken", "alembic"}
        # A history block reads a store through its ``window`` method (WindowSource):
        # no store is imported, not even for type checkers (tests/test_architecture.py).
        assert not imported & {"memstore.store", "memstore.aio", "memstore._db"}, module


# ---- history blocks: who truncates, and what stays (review fixes) ----------------------------

# 3 tokens per message + 1 per word, priming 3.
F = FixedCounter(per_message=3, per_word=1, priming=3)


def chat_store(messages: list[Message]) -> MemoryStore:
    store = MemoryStore("sqlite://", counter=F)
    store.extend("c", messages)
    return store


def qa_history(turns: int = 10) -> list[Message]:
    out = [Message.system("You are helpful.")]
    for i in range(turns):
        out.append(Message.user(f"question number {i} about something"))
        out.append(Message.assistant(f"answer {i} with some detail here"))
    out.append(Message.user("latest question"))
    return out


def history_builder(store: MemoryStore, strategy: Strategy, max_tokens: int,
                    view: Any = None) -> ContextBuilder:
    return ContextBuilder(max_tokens, counter=F).add_block(
        Block("history", tier=Tier.HISTORY, strategy=strategy,
              history=HistoryBlock(store, "c", view)))


def test_a_budgeted_views_omissions_are_the_block_not_fitting() -> None:
    with chat_store(qa_history()) as store:
        truncated = history_builder(store, TruncateOldest(), 60).compile()
        window = truncated.report.history_reports["history"]
        assert any(o.reason == "budget" for o in window.omitted)
        # Not silent: the report says the block was truncated.
        assert truncated.report.evictions == {"history": "truncated"}
        assert truncated.messages[0].text == "You are helpful."
        assert truncated.messages[-1].text == "latest question"
        check_arithmetic(truncated, F)
        # Strict: the history had to be cut, so it does not fit.
        with pytest.raises(ContextBudgetError, match=r"'history'.*Strict") as info:
            history_builder(store, Strict(), 60).compile()
        assert info.value.budget == 57 and info.value.required == 58
        # Drop: all of the history or none of it.
        dropped = history_builder(store, Drop(), 60).compile()
        assert dropped.messages == [] and dropped.report.blocks_dropped == ["history"]
        assert dropped.report.evictions == {"history": "dropped"}
        check_arithmetic(dropped, F)
        # A custom strategy: the view's truncation stands, labelled as such.
        custom = history_builder(store, KeepLast(), 60).compile()
        assert custom.messages == truncated.messages
        assert custom.report.evictions == {"history": "truncated"}
        # When the whole history fits, every strategy keeps it as it is.
        for strategy in (TruncateOldest(), Strict(), Drop(), KeepLast()):
            whole = history_builder(store, strategy, 1000).compile()
            assert len(whole.messages) == 22 and whole.report.evictions == {}


class KeepLast(Strategy):
    def apply(self, messages: list[Message], tokens: int, limit: int,
              counter: TokenCounter) -> list[Message]:
        return messages[-1:]


def test_keep_turns_atomic_on_a_budgeted_view_starts_the_window_on_a_user_message() -> None:
    with chat_store(qa_history()) as store:
        # A 37-token block holds the system message (6), "latest question" (5) and
        # answer 9, question 9, answer 8 (26): the window would begin with a reply
        # without its question.
        plain = history_builder(store, TruncateOldest(), 40).compile()
        assert [m.role for m in plain.messages][:2] == ["system", "assistant"]
        turns = history_builder(store, TruncateOldest(keep_turns_atomic=True), 40).compile()
        assert [m.text for m in turns.messages] == [
            "You are helpful.", "question number 9 about something",
            "answer 9 with some detail here", "latest question"]
        assert turns.report.evictions == {"history": "truncated"}
        omitted = {o.reason for o in turns.report.history_reports["history"].omitted}
        assert omitted == {"budget", "start_on_user"}
        check_arithmetic(turns, F)
    # A history that fits whole keeps the units before its first user message.
    greeting = [Message.assistant("Hello, how can I help?"), Message.user("hi there")]
    with chat_store(greeting) as store:
        whole = history_builder(store, TruncateOldest(keep_turns_atomic=True), 100).compile()
        assert [m.text for m in whole.messages] == ["Hello, how can I help?", "hi there"]
        assert whole.report.evictions == {}


def weather_turn() -> list[Message]:
    """A system message, an old turn, then a question answered by a tool call."""
    return [
        Message.system("sys"),
        Message.user("old question here please"), Message.assistant("old answer here"),
        Message.user("What is the weather in Paris right now?"),
        Message.assistant(tool_calls=[ToolCall(id="w1", name="weather",
                                               arguments='{"city":"Paris"}')]),
        Message.tool("sunny", tool_call_id="w1"),
    ]


def test_keep_turns_atomic_on_a_budgeted_view_never_sends_a_call_without_its_question() -> None:
    messages = weather_turn()
    with chat_store(messages) as store:
        turn = sum(F.count_message(m) for m in messages[:1] + messages[3:])
        # The turn being answered fits: the question stays with the call.
        fits = history_builder(store, TruncateOldest(keep_turns_atomic=True),
                               turn + 3).compile()
        assert [m.role for m in fits.messages] == ["system", "user", "assistant", "tool"]
        assert fits.report.evictions == {"history": "truncated"}
        # It does not: a budget error with the turn's size, never the call alone.
        with pytest.raises(ContextBudgetError, match=r"'history'.*turn") as info:
            history_builder(store, TruncateOldest(keep_turns_atomic=True), turn + 2).compile()
        assert info.value.required == turn and info.value.budget == turn - 1
        # A view's reserve stays free beside the turn.
        reserved = TokenLimitedView(token_limit=100, reserve=4)
        with pytest.raises(ContextBudgetError, match="turn") as info:
            history_builder(store, TruncateOldest(keep_turns_atomic=True), turn + 3,
                            reserved).compile()
        assert info.value.required == turn + 4 and info.value.budget == turn
        fits = history_builder(store, TruncateOldest(keep_turns_atomic=True), turn + 7,
                               reserved).compile()
        assert [m.role for m in fits.messages] == ["system", "user", "assistant", "tool"]


def test_a_budgeted_view_refuses_what_it_cannot_serve_when_the_block_is_made() -> None:
    with chat_store(qa_history(2)) as store:
        summarize = Summarize(lambda ms: "s")
        for view in (None, TokenLimitedView(token_limit=50), ScoreBasedView(token_limit=50),
                     SummaryView(token_limit=50)):
            with pytest.raises(ConfigurationError, match=r"store\.summarize.*SummaryView"):
                Block("h", tier=Tier.HISTORY, strategy=summarize,
                      history=HistoryBlock(store, "c", view))
            with pytest.raises(ConfigurationError, match="count-based view"):
                Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(protect_roles=("user",)),
                      history=HistoryBlock(store, "c", view))
        # Whole turns need a contiguous suffix starting on a user message: SummaryView
        # gives one (start_on_user), ScoreBasedView's picks by score do not.
        with pytest.raises(ConfigurationError, match="ScoreBasedView"):
            Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(keep_turns_atomic=True),
                  history=HistoryBlock(store, "c", ScoreBasedView(token_limit=50)))
        Block("h", tier=Tier.HISTORY, strategy=TruncateOldest(keep_turns_atomic=True),
              history=HistoryBlock(store, "c", SummaryView(token_limit=50)))
        # Count-based views serve them all.
        given: list[int] = []
        for strategy in (Summarize(lambda ms: given.append(len(ms)) or "earlier talk"),
                         TruncateOldest(protect_roles=("user",), keep_turns_atomic=True)):
            compiled = history_builder(store, strategy, 40, UnboundedView()).compile()
            assert compiled.messages[-1].text == "latest question"
            check_arithmetic(compiled, F)
        assert given == [4]


def test_min_messages_on_a_budgeted_view_keeps_the_protected_messages() -> None:
    with chat_store(qa_history()) as store:
        # The window holds 5 messages; min_messages=6 keeps only the protected ones.
        compiled = history_builder(store, TruncateOldest(min_messages=6), 40).compile()
        assert [m.text for m in compiled.messages] == ["You are helpful.", "latest question"]
        assert compiled.report.evictions == {"history": "truncated"}
        assert compiled.report.blocks_dropped == []
        check_arithmetic(compiled, F)
        assert len(history_builder(store, TruncateOldest(min_messages=5), 40)
                   .compile().messages) == 5


def test_the_newest_unit_is_the_question_even_when_a_system_message_follows_it() -> None:
    messages = [
        Message.system("You are helpful."),
        Message.user("earlier question"), Message.assistant("earlier answer"),
        Message.user("please summarise the attached quarterly report in three bullet points"),
        Message.system("Reminder: answer in French."),
    ]
    with chat_store(messages) as store:
        # system 6 + question 13 + reminder 7 = 26 tokens must stay; the block gets 17.
        for view in (None, UnboundedView()):
            with pytest.raises(ContextBudgetError, match="the newest unit") as info:
                history_builder(store, TruncateOldest(), 20, view).compile()
            assert info.value.required == 26 and info.value.budget == 17
        with pytest.raises(ContextBudgetError, match="the newest unit"):
            history_builder(store, Summarize(lambda ms: "S"), 20, UnboundedView()).compile()
        # With room for them, the older turn goes and the question stays.
        kept = history_builder(store, TruncateOldest(), 31, UnboundedView()).compile()
        assert [m.text for m in kept.messages] == [messages[0].text, messages[3].text,
                                                    messages[4].text]
        given: list[list[str]] = []
        summarized = history_builder(
            store, Summarize(lambda ms: given.append([m.text for m in ms]) or "S"), 38,
            UnboundedView()).compile()
        assert given == [["earlier question", "earlier answer"]]
        assert [m.text for m in summarized.messages] == [
            messages[0].text, "S", messages[3].text, messages[4].text]


def test_turn_atomic_truncation_keeps_the_current_turns_question() -> None:
    messages = weather_turn()
    with chat_store(messages) as store:
        strategy = TruncateOldest(keep_turns_atomic=True)
        # The current turn (question, call, result) and the system message need 22 tokens.
        with pytest.raises(ContextBudgetError, match="turn") as info:
            history_builder(store, strategy, 20, UnboundedView()).compile()
        assert info.value.required == 22 and info.value.budget == 17
        compiled = history_builder(store, strategy, 25, UnboundedView()).compile()
        assert [m.role for m in compiled.messages] == ["system", "user", "assistant", "tool"]
        assert compiled.report.evictions == {"history": "truncated"}


def test_min_messages_never_drops_protected_messages_of_a_history_block() -> None:
    messages = [Message.system("You are a careful agent."), Message.user("one two three four five"),
                Message.assistant("six seven eight nine ten"), Message.user("final question")]
    with chat_store(messages) as store:
        compiled = history_builder(store, TruncateOldest(min_messages=4), 25,
                                   UnboundedView()).compile()
        assert [m.text for m in compiled.messages] == ["You are a careful agent.",
                                                        "final question"]
        assert compiled.report.evictions == {"history": "truncated"}
        assert compiled.report.blocks_dropped == []


@pytest.mark.parametrize("summary", ["", "   \n", "a\x00b", Message.system("  ")])
def test_summarize_refuses_an_empty_or_unstorable_summary(summary: Any) -> None:
    builder = ContextBuilder(15, counter=F).add_block(
        Block("notes", tier=1, strategy=Summarize(lambda ms: summary),
              messages=[Message.user("a b c d e f")] * 3))
    with pytest.raises(InvalidInputError, match="'notes'"):
        builder.compile()


class BadCounter:
    def __init__(self, name: str, one: Any, empty: Any) -> None:
        self.name, self.one, self.empty = name, one, empty

    def count_message(self, message: Message) -> Any:
        return self.one

    def count_messages(self, messages: Any) -> Any:
        return self.empty


@pytest.mark.parametrize(("one", "empty"), [(1, None), (1, -1), (None, 0), (-5, 3), (True, 0)])
def test_a_counter_returning_a_bad_count_is_named_in_the_error(one: Any, empty: Any) -> None:
    with pytest.raises(ConfigurationError, match="'bad'"):
        counter: Any = BadCounter("bad", one, empty)
        ContextBuilder(10, counter=counter).add_block(
            Block("a", tier=0, strategy=Drop(), messages=[Message.user("x")] * 10)).compile()


def test_bad_arguments_are_library_errors_not_type_errors() -> None:
    builder = ContextBuilder(10, counter=F)
    with pytest.raises(ConfigurationError, match="block id"):
        builder.remove_block(["x"])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="protect_roles"):
        TruncateOldest(protect_roles=[["user"]])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match="formatter must be a callable"):
        inject_into_system(Message.system("s"), "xml", ["a"])  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="NUL"):
        inject_into_system(Message.system("s"), lambda texts: "a\x00", ["a"])


def test_the_builders_budget_has_the_views_upper_bound() -> None:
    with pytest.raises(ConfigurationError, match=r"2\*\*53 - 1"):
        ContextBuilder(2**53, counter=F)
    with chat_store([Message.user("hi")]) as store:
        compiled = history_builder(store, TruncateOldest(), 2**53 - 1).compile()
        assert [m.text for m in compiled.messages] == ["hi"]
