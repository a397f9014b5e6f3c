"""Property tests of ContextBuilder: random blocks, tiers, strategies and budgets."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstore import (
    Block,
    BufferedView,
    CompiledContext,
    ConfigurationError,
    ContextBudgetError,
    ContextBuilder,
    ContextView,
    ContextWindow,
    ConversationNotFoundError,
    Drop,
    FixedCounter,
    HeadAndTailView,
    HistoryBlock,
    Message,
    RecentTurnsView,
    ScoreBasedView,
    StoredMessage,
    Strategy,
    Strict,
    Summarize,
    Tier,
    TokenCounter,
    TokenLimitedView,
    ToolCall,
    TruncateOldest,
    UnboundedView,
)
from memstore.views.units import group_units
from tests.helpers import examples

SETTINGS = settings(max_examples=examples(120), derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def tag(message: Message) -> str:
    value = message.metadata["block"]
    assert isinstance(value, str)
    return value


@st.composite
def units(draw: st.DrawFn, block: str, index: int) -> list[Message]:
    """One unit of a block's messages, tagged with the block id."""
    meta = {"block": block}
    text = " ".join(["w"] * draw(st.integers(0, 6))) or "w"
    kind = draw(st.sampled_from(["user", "assistant", "system", "developer", "pinned", "tool"]))
    if kind == "tool":
        calls = draw(st.integers(1, 3))
        ids = [f"{block}-{index}-{i}" for i in range(calls)]
        order = draw(st.permutations(ids))
        return [
            Message.assistant(tool_calls=[ToolCall(id=i, name="f") for i in ids], metadata=meta),
            *[Message.tool(text, tool_call_id=i, metadata=meta) for i in order],
        ]
    if kind == "pinned":
        return [Message.user(text, pinned=True, metadata=meta)]
    return [Message(role=kind, content=text, metadata=meta)]


class KeepNewestUnit(Strategy):
    """A custom strategy: keep the newest unit only (may overrun the budget)."""

    def apply(self, messages: list[Message], tokens: int, limit: int,
              counter: TokenCounter) -> list[Message]:
        start = len(messages) - 1
        while start > 0 and messages[start].role == "tool":
            start -= 1
        return messages[start:]


@dataclass
class Spec:
    id: str
    tier: int
    kind: str
    messages: list[Message]
    max_tokens: int | None
    summary_words: int


@st.composite
def specs(draw: st.DrawFn) -> list[Spec]:
    out = []
    for b in range(draw(st.integers(0, 6))):
        block = f"b{b}"
        messages: list[Message] = []
        for u in range(draw(st.integers(0, 6))):
            messages.extend(draw(units(block, u)))
        out.append(Spec(
            id=block,
            tier=draw(st.integers(0, 4)),
            kind=draw(st.sampled_from(
                ["strict", "drop", "truncate", "truncate_turns", "truncate_min",
                 "summarize", "custom"])),
            messages=messages,
            max_tokens=draw(st.none() | st.integers(1, 60)),
            summary_words=draw(st.integers(0, 20)),
        ))
    return out


def strategy_for(spec: Spec) -> Strategy:
    if spec.kind == "strict":
        return Strict()
    if spec.kind == "drop":
        return Drop()
    if spec.kind == "truncate":
        return TruncateOldest(protect_roles=("tool",) if spec.tier == 4 else ())
    if spec.kind == "truncate_turns":
        return TruncateOldest(keep_turns_atomic=True)
    if spec.kind == "truncate_min":
        return TruncateOldest(min_messages=3)
    if spec.kind == "summarize":
        def summarizer(messages: list[Message]) -> Message:
            return Message.system(" ".join(["s"] * spec.summary_words) or "s",
                                  metadata={"block": spec.id})
        return Summarize(summarizer)
    return KeepNewestUnit()


def assert_units_whole(messages: list[Message]) -> None:
    i = 0
    while i < len(messages):
        m = messages[i]
        assert m.role != "tool", f"orphan tool result at {i}"
        if m.tool_calls:
            j = i + 1
            while j < len(messages) and messages[j].role == "tool":
                j += 1
            answered = sorted(r.tool_call_id or "" for r in messages[i + 1 : j])
            assert answered == sorted(m.tool_call_ids), "a split tool unit"
            i = j
        else:
            i += 1


def check(compiled: CompiledContext, counter: FixedCounter, max_tokens: int,
          blocks: list[Spec]) -> None:
    report = compiled.report
    total = counter.count_messages(compiled.messages)
    # The guarantee, and the report's arithmetic.
    assert total <= max_tokens
    assert total == compiled.token_count == report.total_tokens_used
    assert total == counter.priming + sum(report.tokens_per_block.values())
    assert report.remaining_tokens == max_tokens - total
    assert report.original_tokens == sum(report.original_tokens_per_block.values())
    # Tool units stay whole.
    assert_units_whole(compiled.messages)
    # Output order = tier order, then insertion order.
    rank = {spec.id: (spec.tier, i) for i, spec in enumerate(blocks)}
    ranks = [rank[tag(m)] for m in compiled.messages]
    assert ranks == sorted(ranks)
    by_id = {spec.id: spec for spec in blocks}
    for block_id in report.tokens_per_block:
        spec = by_id[block_id]
        out = [m for m in compiled.messages if tag(m) == block_id]
        assert counter.count_messages(out) - counter.priming == report.tokens_per_block[block_id]
        label = report.evictions.get(block_id)
        if label is None:
            assert out == spec.messages
        elif label in ("truncated", "evicted"):
            # A subsequence of the block, in order.
            it = iter(spec.messages)
            assert all(any(m == n for n in it) for m in out)
        if label == "truncated" and out:
            anchored = [m for m in spec.messages if m.anchored]
            assert [m for m in out if m.anchored] == anchored
        if label == "summarized":  # no strategy removes an anchored message
            assert all(m in out for m in spec.messages if m.anchored)
    assert set(report.evictions) <= set(report.original_tokens_per_block)
    assert len(report.blocks_dropped) == len(set(report.blocks_dropped))
    for block_id in report.blocks_dropped:
        assert block_id in report.evictions and report.tokens_per_block[block_id] == 0
    for spec in blocks:
        assert (spec.id in report.original_tokens_per_block) == bool(spec.messages)


@SETTINGS
@given(blocks=specs(), max_tokens=st.integers(1, 150), per_message=st.integers(0, 3),
       per_tool_call=st.integers(0, 2), priming=st.integers(0, 3))
def test_compile_never_exceeds_the_budget_and_the_report_adds_up(
    blocks: list[Spec], max_tokens: int, per_message: int, per_tool_call: int, priming: int
) -> None:
    counter = FixedCounter(per_message=per_message, per_word=1, per_tool_call=per_tool_call,
                           priming=priming)
    max_tokens = max(max_tokens, priming)
    builder = ContextBuilder(max_tokens, counter=counter)
    for spec in blocks:
        builder.add_block(Block(spec.id, tier=spec.tier, strategy=strategy_for(spec),
                                messages=spec.messages, max_tokens=spec.max_tokens))
    try:
        compiled = builder.compile()
    except ContextBudgetError as exc:
        # An error only when a block that must fit does not: the numbers say so.
        assert exc.required > exc.budget >= 0
        assert any(
            f"'{spec.id}'" in str(exc) and (
                spec.kind in ("strict", "truncate", "truncate_turns", "truncate_min", "custom")
                # Summarize keeps anchored messages: too many of them is a budget error
                or (spec.kind == "summarize" and "anchored messages" in str(exc)))
            for spec in blocks
        ), str(exc)
        return
    check(compiled, counter, max_tokens, blocks)
    # Compiling again with nothing changed gives the same result.
    assert builder.compile() == compiled


@SETTINGS
@given(blocks=specs(), max_tokens=st.integers(1, 150))
def test_drop_and_truncate_only_never_raise(blocks: list[Spec], max_tokens: int) -> None:
    """Without Strict, custom strategies or protected overflow, compile always succeeds."""
    counter = FixedCounter(per_message=1, per_word=1, priming=1)
    builder = ContextBuilder(max_tokens, counter=counter)
    for spec in blocks:
        # Anchored messages made plain, so truncation can always make room.
        plain = [m.model_copy(update={"role": "user" if m.role in ("system", "developer")
                                      else m.role, "pinned": False}) for m in spec.messages]
        spec.messages = plain
        strategy: Any = Drop() if spec.tier % 2 else TruncateOldest(keep_turns_atomic=spec.tier > 2)
        builder.add_block(Block(spec.id, tier=spec.tier, strategy=strategy, messages=plain,
                                max_tokens=spec.max_tokens))
    compiled = builder.compile()
    check(compiled, counter, max_tokens, blocks)


# ---- history blocks over an in-memory store (the database paths are in test_builder.py) -----


class ListStore:
    """A store stand-in: ``window`` runs the view over a list (what the real stores do in SQL)."""

    def __init__(self, messages: list[StoredMessage], counter: TokenCounter) -> None:
        self.messages = messages
        self.counter = counter

    def window(self, conversation_id: str, view: ContextView) -> ContextWindow:
        if conversation_id != "chat":
            raise ConversationNotFoundError(conversation_id)
        return view.apply(self.messages, view.resolve_counter(self.counter))


def stored(messages: list[Message], counter: TokenCounter) -> list[StoredMessage]:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return [
        StoredMessage(**m.model_dump(exclude={"id"}), conversation_id="chat", seq=i + 1,
                      created_at=now, token_count=counter.count_message(m),
                      token_counter=counter.name, id=f"m{i + 1}")
        for i, m in enumerate(messages)
    ]


VIEWS = st.sampled_from([
    None,
    TokenLimitedView(token_limit=1),
    TokenLimitedView(token_limit=1, start_on_user=True),
    ScoreBasedView(token_limit=1, keep_rate=0.5),
    BufferedView(buffer_size=4),
    RecentTurnsView(max_turns=2),
    HeadAndTailView(head_size=2, tail_size=3),
    UnboundedView(),
])


def budgeted(view: ContextView | None) -> bool:
    return view is None or view.budgeted


@SETTINGS
@given(spec=specs(), view=VIEWS, max_tokens=st.integers(1, 200), history_cap=st.none()
       | st.integers(1, 80), kind=st.sampled_from(
           ["strict", "drop", "truncate", "turns", "min", "summarize"]))
def test_history_blocks_never_exceed_the_budget(
    spec: list[Spec], view: ContextView | None, max_tokens: int, history_cap: int | None,
    kind: str,
) -> None:
    counter = FixedCounter(per_message=2, per_word=1, per_tool_call=1, priming=2)
    max_tokens = max(max_tokens, 2)
    history = [m for s in spec for m in s.messages]
    store = ListStore(stored(history, counter), counter)
    strategy: Strategy = {"strict": Strict(), "drop": Drop(), "truncate": TruncateOldest(),
                          "turns": TruncateOldest(keep_turns_atomic=True),
                          "min": TruncateOldest(min_messages=3),
                          "summarize": Summarize(lambda ms: f"{len(ms)} earlier messages")}[kind]
    builder = ContextBuilder(max_tokens, counter=counter)
    builder.add_block(Block("system", tier=Tier.SYSTEM, strategy=Drop(),
                            messages=[Message.system("be brief")]))
    history_block = HistoryBlock(store, "chat", view)  # type: ignore[arg-type]
    refused = budgeted(view) and (kind == "summarize" or (
        kind == "turns" and view is not None and not hasattr(view, "start_on_user")))
    if refused:  # what a budgeted view cannot serve is refused when the block is made
        with pytest.raises(ConfigurationError):
            Block("h", tier=Tier.HISTORY, strategy=strategy, history=history_block)
        return
    builder.add_block(Block("h", tier=Tier.HISTORY, strategy=strategy, max_tokens=history_cap,
                            history=history_block))
    builder.add_block(Block("none", tier=Tier.HISTORY, strategy=Strict(),
                            history=HistoryBlock(store, "nobody", view)))  # type: ignore[arg-type]
    try:
        compiled = builder.compile()
    except ContextBudgetError as exc:
        assert exc.required > exc.budget >= 0
        assert "'h'" in str(exc) and kind in ("strict", "truncate", "turns", "min", "summarize")
        return
    report = compiled.report
    total = counter.count_messages(compiled.messages)
    assert total == report.total_tokens_used <= max_tokens
    assert total == counter.priming + sum(report.tokens_per_block.values())
    assert_units_whole(compiled.messages)
    assert set(report.history_reports) == {"h", "none"}
    assert "none" not in report.original_tokens_per_block
    # Output is a subsequence of the stored history (in order), after the system block.
    out = [m for m in compiled.messages if isinstance(m, StoredMessage)]
    seqs = [m.seq for m in out]
    assert seqs == sorted(set(seqs))
    if "h" in report.tokens_per_block and report.evictions.get("h") != "dropped":
        window_report = report.history_reports["h"]
        assert window_report.included_count >= len(out)
    window_report = report.history_reports["h"]
    if budgeted(view) and any(o.reason in ("budget", "score") for o in window_report.omitted):
        # A budgeted view's truncation is the block not fitting: never silent.
        assert report.evictions.get("h") == ("dropped" if kind == "drop" else "truncated")
    if "h" in report.tokens_per_block and kind != "drop":
        # The newest complete unit that is not anchored (the question being answered) is
        # kept by every view, and no strategy removes it (a system message after it or
        # min_messages included).
        units = [u for u in group_units(store.messages) if u.complete and not u.anchored]
        if units:
            assert all(m in out for m in units[-1].messages)
