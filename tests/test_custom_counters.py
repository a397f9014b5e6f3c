"""Custom token counters (the protocol only, or a BaseTokenCounter subclass) everywhere a
counter goes, and the two view edge cases (HeadAndTailView's placeholder around an
incomplete unit, RecentTurnsView with no more turns than max_turns) through the stores."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from memstore import (
    BaseTokenCounter,
    BufferedView,
    ConfigurationError,
    ContextView,
    ConversationState,
    HeadAndTailView,
    ListHistory,
    Message,
    RecentTurnsView,
    ScoreBasedView,
    SummaryView,
    TokenCounter,
    TokenLimitedView,
    UnboundedView,
    view_from_config,
)
from memstore.tokens import (
    FixedCounter,
    count_tool_schemas,
    counter_priming,
    validate_counter,
)
from tests.helpers import Cases, call
from tests.viewcases import CALL, RES, U, labels, stored

ROOT = Path(__file__).resolve().parent.parent
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]


class ProtoCounter:
    """Exactly the documented protocol: name, count_message, count_messages."""

    def __init__(self, name: str = "proto/words", priming: int = 2) -> None:
        self.name = name
        self._priming = priming
        self.calls = 0

    def count_message(self, message: Message) -> int:
        self.calls += 1
        return 3 + len(message.text.split()) + 2 * len(message.tool_calls or ())

    def count_messages(self, messages: Iterable[Message]) -> int:
        return sum(self.count_message(m) for m in messages) + self._priming


class OnlyNameAndMessage(BaseTokenCounter):
    """A BaseTokenCounter subclass with only name and count_message."""

    name = "sub/chars"

    def count_message(self, message: Message) -> int:
        return 1 + len(message.text) // 4


class WithTextHook(OnlyNameAndMessage):
    name = "sub/chars+text"
    priming = 5

    def count_text(self, text: str) -> int:
        return len(text) // 4


def every_view(counter: TokenCounter | None = None) -> list[ContextView]:
    return [
        UnboundedView(),
        BufferedView(3),
        HeadAndTailView(2, 2),
        TokenLimitedView(60, reserve=4, counter=counter),
        TokenLimitedView(60, start_on_user=True, counter=counter),
        ScoreBasedView(60, keep_rate=0.5, counter=counter),
        RecentTurnsView(2, remove_tool_messages=True),
    ]


def history() -> list[Message]:
    return [
        Message.system("be brief"),
        U("hello there"),
        Message.assistant("hi, how can I help"),
        U("look it up"),
        CALL("c1"),
        RES("c1", "found it"),
        Message.assistant("here it is", pinned=True),
        U("thanks a lot"),
        Message.assistant("you are welcome"),
    ]


# ---- the protocol and its validation -------------------------------------------------------


def test_protocol_is_the_three_documented_members() -> None:
    counter = ProtoCounter()
    assert isinstance(counter, TokenCounter)
    assert validate_counter(counter) is counter
    assert not hasattr(counter, "priming") and not hasattr(counter, "count_tools")
    assert counter_priming(counter) == 2  # derived as count_messages([])
    assert counter_priming(FixedCounter(priming=7)) == 7  # the capability when present
    assert count_tool_schemas(counter, None) == 0 and count_tool_schemas(counter, []) == 0
    with pytest.raises(ConfigurationError, match=r"'proto/words' \(ProtoCounter\) has no "
                                                 r"count_tools method"):
        count_tool_schemas(counter, TOOLS)


class NoCountMessage:
    name = "x"

    def count_messages(self, messages: Iterable[Message]) -> int:
        return 0


class NoCountMessages:
    name = "x"

    def count_message(self, message: Message) -> int:
        return 0


class BadPriming(ProtoCounter):
    priming = -1


@pytest.mark.parametrize(("bad", "match"), [
    (NoCountMessage(), "has no count_message method"),
    (NoCountMessages(), "has no count_messages method"),
    (ProtoCounter(name=""), "name must be a non-empty string"),
    (ProtoCounter(name=3), "name must be a non-empty string"),  # type: ignore[arg-type]
    (BaseTokenCounter(), "name failed"),
    ("tiktoken/cl100k_base", "got the string 'tiktoken/cl100k_base'.*counter_from_name"),
    (object(), "has no count_message or count_messages method"),
])
def test_bad_counters_are_rejected_clearly(bad: Any, match: str, tmp_path: Path) -> None:
    from memstore import MemoryStore

    for make in (lambda: TokenLimitedView(10, counter=bad),
                 lambda: ScoreBasedView(10, counter=bad),
                 lambda: UnboundedView().apply([], bad),
                 lambda: MemoryStore(f"sqlite:///{tmp_path / 'x.db'}", counter=bad)):
        with pytest.raises(ConfigurationError, match=match):
            make()
    assert not (tmp_path / "x.db").exists()


def test_a_priming_that_is_not_a_count_is_refused() -> None:
    with pytest.raises(ConfigurationError,
                       match=r"priming must return an int in \[0, 2\*\*53 - 1\]"):
        UnboundedView().apply(stored([U("a")]), BadPriming())


# ---- every view, over a list ----------------------------------------------------------------


@pytest.mark.parametrize("counter", [ProtoCounter(), OnlyNameAndMessage(), WithTextHook()],
                         ids=["protocol", "subclass", "subclass+count_text"])
def test_every_view_works_with_a_custom_counter(counter: TokenCounter) -> None:
    # Stored counts come from another counter: every view recounts what it reads.
    msgs = stored(history(), counter=FixedCounter(1))
    for view in every_view(counter) + every_view(None):
        window = view.apply(msgs, counter)
        assert window.messages, view
        assert window.token_count == counter.count_messages(window.messages), view
        assert window.report.counter == counter.name
        if view.budgeted:
            assert window.token_count + getattr(view, "reserve", 0) <= 60


def test_base_counter_gives_count_messages_priming_and_equality() -> None:
    counter = OnlyNameAndMessage()
    m = [U("abcdefgh"), U("")]
    assert counter.priming == 0
    assert counter.count_messages(m) == 3 + 1
    assert counter.count_messages([]) == 0 == counter_priming(counter)
    assert WithTextHook().count_messages(m) == 4 + 5
    assert counter == OnlyNameAndMessage() and hash(counter) == hash(OnlyNameAndMessage())
    assert counter != WithTextHook() and repr(counter) == "OnlyNameAndMessage('sub/chars')"
    # count_tools without a count_text hook: the text's count under count_message
    # (a user message holding the schemas' JSON, less an empty one)
    assert counter.count_tools(TOOLS) == len(json.dumps(TOOLS, ensure_ascii=False)) // 4 > 0
    assert counter.count_tools([]) == 0

    class Shrinking(OnlyNameAndMessage):
        def count_message(self, message: Message) -> int:
            return 100 - len(message.text)

    with pytest.raises(ConfigurationError, match="implement count_text"):
        Shrinking().count_tools(TOOLS)
    hooked = WithTextHook()
    assert hooked.count_tools(TOOLS) == len(json.dumps(TOOLS, ensure_ascii=False)) // 4 > 0


def test_tools_need_count_tools() -> None:
    msgs = stored(history())
    # A view naming such a counter refuses at construction...
    for cls in (TokenLimitedView, ScoreBasedView, SummaryView):
        with pytest.raises(ConfigurationError, match="no count_tools method"):
            cls(50, tools=TOOLS, counter=ProtoCounter())
        # ...and a view using the store's (or a given) counter at window time, even empty.
        view = cls(50, tools=TOOLS)
        for history_ in (msgs, []):
            with pytest.raises(ConfigurationError, match="no count_tools method"):
                view.apply(history_, ProtoCounter())
        # A BaseTokenCounter subclass counts them (count_text derived from count_message,
        # or its own hook) into the reserve.
        for counter in (OnlyNameAndMessage(), WithTextHook()):
            window = cls(50, tools=TOOLS).apply(msgs, counter)
            assert window.token_count + counter.count_tools(TOOLS) <= 50


# ---- through the stores ------------------------------------------------------------------------


@pytest.fixture
def counter() -> ProtoCounter:
    """Overrides conftest's: the ``store`` fixture is built with a protocol-only counter."""
    return ProtoCounter()


async def test_store_counts_with_a_protocol_only_counter(store: Any, counter: ProtoCounter
                                                         ) -> None:
    written = await call(store.extend("c", history()))
    assert {m.token_counter for m in written} == {"proto/words"}
    assert [m.token_count for m in written] == [counter.count_message(m) for m in history()]
    assert await call(store.count_tokens("c")) == sum(m.token_count for m in written)
    for view in every_view(None) + every_view(WithTextHook()):
        window = await call(store.window("c", view))
        used = view.resolve_counter(counter)
        assert window.token_count == used.count_messages(window.messages), view
        expected = view.apply(written, used)
        assert window.messages == expected.messages, view
        assert window.token_count == expected.token_count, view
        assert window.report.omitted == expected.report.omitted, view
    with pytest.raises(ConfigurationError, match="no count_tools method"):
        await call(store.window("c", TokenLimitedView(100, tools=TOOLS)))


async def test_a_view_naming_another_counter_recounts_only_what_it_reads(store: Any) -> None:
    await call(store.extend("long", [U(f"message number {i}") for i in range(300)]))
    other = ProtoCounter(name="proto/other")
    window = await call(store.window("long", TokenLimitedView(40, counter=other)))
    assert window.report.counter == "proto/other" and len(window.messages) == 6  # (40 - 2) // 6
    assert 0 < other.calls <= window.report.rows_read + len(window.messages) < 300
    # The stored counts are untouched (reading never writes).
    assert {m.token_counter for m in await call(store.messages("long"))} == {"proto/words"}


async def test_state_round_trips_with_a_custom_counter(store: Any, counter: ProtoCounter
                                                       ) -> None:
    await call(store.extend("src", history()))
    view = TokenLimitedView(40, counter=WithTextHook())
    context = store.context("src", view)
    state = await call(context.save_state())
    parsed = ConversationState.from_json(state.to_json())
    assert parsed == state
    assert {m.token_counter for m in parsed.messages} == {"proto/words"}
    assert parsed.view is not None and parsed.view["counter"] == "sub/chars+text"
    # The custom counter comes back when it is given; without it the error says how.
    assert view_from_config(parsed.view, counters=[WithTextHook(), counter]) == view
    with pytest.raises(ConfigurationError, match="counters="):
        view_from_config(parsed.view)
    await call(store.load_state(parsed, "dst"))
    for v in every_view(None):
        src = await call(store.window("src", v))
        dst = await call(store.window("dst", v))
        def strip(w: Any) -> list[dict[str, Any]]:
            return [m.model_dump(exclude={"conversation_id"}) for m in w.messages]

        assert strip(src) == strip(dst) and src.token_count == dst.token_count, v
        assert src.report == dst.report, v


def test_async_store_takes_a_base_counter_subclass(tmp_path: Path) -> None:
    import asyncio

    from memstore import AsyncMemoryStore

    async def main() -> None:
        store = AsyncMemoryStore(f"sqlite+aiosqlite:///{tmp_path / 'a.db'}",
                                 counter=OnlyNameAndMessage())
        await store.setup()
        try:
            written = await store.extend("c", history())
            assert {m.token_counter for m in written} == {"sub/chars"}
            for view in every_view(None):
                window = await store.window("c", view)
                assert window.token_count == OnlyNameAndMessage().count_messages(window.messages)
        finally:
            await store.close()

    asyncio.run(main())


# ---- the two view edge cases, through the stores ------------------------------------------------


async def test_head_and_tail_placeholder_for_an_incomplete_unit_between(store: Any) -> None:
    # head 1 = [u1]; tail 3 reaches back to u2 (the walks meet), but the unanswered
    # call between them is left out: the placeholder says so.
    await call(store.extend("c", [U("u1"), CALL("lost"), U("u2"), Message.assistant("a2")]))
    window = await call(store.window("c", HeadAndTailView(1, 3)))
    assert labels(window) == ["u1", "<Skipped 1 message.>", "u2", "a2"]
    assert window.report.skipped == 1
    assert [(o.first_seq, o.reason) for o in window.report.omitted] == [(2, "incomplete_unit")]
    # Walks that do not meet: N counts the incomplete unit and the units left out.
    await call(store.extend("d", [U("u1"), CALL("lost"), U("u2"), U("u3"), U("u4")]))
    window = await call(store.window("d", HeadAndTailView(1, 1)))
    assert labels(window) == ["u1", "<Skipped 3 messages.>", "u4"]
    assert window.report.skipped == 3 == window.messages[1].metadata["memstore"]["skipped"]
    # An anchored message after the incomplete unit follows the placeholder.
    await call(store.extend("e", [U("u1"), CALL("lost"), Message.system("S"), U("u2")]))
    window = await call(store.window("e", HeadAndTailView(1, 1)))
    assert labels(window) == ["u1", "<Skipped 1 message.>", "S", "u2"]
    # Nothing left out between head and tail: no placeholder.
    await call(store.extend("f", [U("u1"), U("u2"), U("u3")]))
    window = await call(store.window("f", HeadAndTailView(1, 2)))
    assert labels(window) == ["u1", "u2", "u3"] and window.report.skipped == 0


async def test_recent_turns_keeps_everything_with_no_more_turns_than_max(store: Any) -> None:
    await call(store.extend("c", [
        U("pinned question", pinned=True),
        Message.assistant("greeting"),
        U("q1"), Message.assistant("a1"),
        U("q2"), Message.assistant("a2"),
    ]))
    # Two non-anchored user turns, max_turns 2: nothing is trimmed, the greeting stays.
    window = await call(store.window("c", RecentTurnsView(2)))
    assert labels(window) == ["pinned question", "greeting", "q1", "a1", "q2", "a2"]
    assert window.report.omitted == []
    window = await call(store.window("c", RecentTurnsView(5)))
    assert labels(window) == ["pinned question", "greeting", "q1", "a1", "q2", "a2"]
    # More turns than max_turns: the window starts at the max_turns-th newest user turn.
    window = await call(store.window("c", RecentTurnsView(1)))
    assert labels(window) == ["pinned question", "q2", "a2"]
    assert [(o.first_seq, o.last_seq, o.reason) for o in window.report.omitted] == [
        (2, 4, "max_turns")]
    await call(store.append("c", U("q3")))
    window = await call(store.window("c", RecentTurnsView(2)))
    assert labels(window) == ["pinned question", "q2", "a2", "q3"]


# ---- the documented example ---------------------------------------------------------------------


def test_concepts_custom_counter_example_runs(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    text = (ROOT / "docs" / "concepts.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert any("BaseTokenCounter" in b and "encode" in b for b in blocks)
    for i, code in enumerate(blocks):
        exec(compile(code, f"concepts.md block {i}", "exec"), {"__name__": "__docs__"})


def test_list_history_source_counts_with_custom_priming() -> None:
    msgs = stored([U("a b"), Message.assistant("c")], counter=ProtoCounter())
    window = UnboundedView().select(ListHistory(msgs), ProtoCounter())
    assert window.token_count == 5 + 4 + 2


# ---- the context builder -----------------------------------------------------------------------


async def test_context_builder_takes_a_protocol_only_counter(store: Any, counter: ProtoCounter
                                                             ) -> None:
    from memstore import (
        AsyncMemoryStore,
        Block,
        ContextBuilder,
        HistoryBlock,
        Strict,
        Tier,
        TruncateOldest,
    )

    await call(store.extend("c", history()))
    builder = (
        ContextBuilder(max_tokens=60, counter=counter)
        .add_block(Block("system", tier=Tier.SYSTEM, strategy=Strict(),
                         messages=[Message.system("be brief")]))
        .add_block(Block("history", tier=Tier.HISTORY, strategy=TruncateOldest(),
                         history=HistoryBlock(store, "c")))
    )
    if isinstance(store, AsyncMemoryStore):
        compiled = await builder.acompile()
    else:
        compiled = builder.compile()
    assert compiled.messages
    assert compiled.token_count == counter.count_messages(compiled.messages) <= 60
    with pytest.raises(ConfigurationError, match="name must be a non-empty string"):
        ContextBuilder(max_tokens=60, counter=ProtoCounter(name=""))


class Returns(ProtoCounter):
    """Counts assistant messages as ``value`` (not a token count), others as words."""

    def __init__(self, value: Any) -> None:
        super().__init__(name=f"returns/{type(value).__name__}")
        self.value = value

    def count_message(self, message: Message) -> int:
        return self.value if message.role == "assistant" else super().count_message(message)


_NOT_A_COUNT = r"count_message must return an int in \[0, 2\*\*53 - 1\]"


#: What a bad counter returns. 10**5000: the error message's repr() of it raised
#: ValueError (over 4,300 digits).
NOT_COUNTS: list[tuple[str, Any]] = [("-1000", -1000), ("None", None), ("'3'", "3"),
                                     ("2.5", 2.5), ("True", True), ("huge-int", 10**5000),
                                     ("2**53", 2**53)]


async def test_a_views_own_counter_returning_no_count_is_refused(store: Any) -> None:
    """A view's own counter counts at window time, where the store checks nothing: a
    negative count let a window overrun its budget silently (token_count -19340 for 40
    messages within 60), None or "3" raised TypeError, 2.5 leaked a float count.

    The values of NOT_COUNTS share one store, each on a conversation of its own (read
    first by its own case, as on a new store); a failure names every failing value."""
    cases = Cases()
    for name, value in NOT_COUNTS:
        with cases.case(name):
            cid = f"c-{name}"
            await call(store.extend(cid, [m for i in range(20) for m in (
                Message.user(f"question {i} about things"), Message.assistant(f"answer {i}"))]))
            bad = Returns(value)
            views: list[ContextView] = [TokenLimitedView(60, counter=bad),
                                        ScoreBasedView(60, counter=bad),
                                        SummaryView(60, counter=bad)]
            for view in views:
                with pytest.raises(ConfigurationError, match=_NOT_A_COUNT):
                    await call(store.window(cid, view))
                with pytest.raises(ConfigurationError, match=_NOT_A_COUNT):
                    view.apply(await call(store.messages(cid)), bad)
            # the same counter counting well is used as it is, checks and all
            good = ProtoCounter("proto/good")
            window = await call(store.window(cid, TokenLimitedView(60, counter=good)))
            assert window.token_count == good.count_messages(window.messages) <= 60
    cases.check()
