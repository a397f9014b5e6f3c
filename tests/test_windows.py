"""Windows through the store, on SQLite and PostgreSQL: cost, purity, state, tool safety."""

from __future__ import annotations

import random
from typing import Any

import pytest

from memstore._db import statements as _statements
from memstore._db import window as _window
from memstore.errors import ContextBudgetError
from memstore.models import ConversationState, Message, ToolCall
from memstore.store import MemoryStore
from memstore.tokens import ApproxCounter, FixedCounter
from memstore.views import (
    BufferedView,
    HeadAndTailView,
    RecentTurnsView,
    ScoreBasedView,
    TokenLimitedView,
    UnboundedView,
    view_from_config,
)
from tests.helpers import call

VIEWS = [
    UnboundedView(),
    BufferedView(5),
    HeadAndTailView(2, 4),
    TokenLimitedView(120),
    TokenLimitedView(120, start_on_user=True, reserve=10),
    ScoreBasedView(120),
    ScoreBasedView(120, half_life=30.0),
    RecentTurnsView(2),
    RecentTurnsView(2, remove_tool_messages=True),
]


def conversation(n_turns: int, seed: int = 7, words: tuple[int, int] = (3, 12)) -> list[Message]:
    """A realistic conversation: system prompt, turns, ~10% tool calls (some parallel)."""
    rng = random.Random(seed)
    out = [Message.system("You are a careful assistant.")]

    def text(prefix: str) -> str:
        count = rng.randint(*words)
        return prefix + " " + " ".join(f"w{rng.randrange(1000)}" for _ in range(count))

    for turn in range(n_turns):
        out.append(Message.user(text(f"u{turn}")))
        if rng.random() < 0.1:
            k = rng.choice([1, 1, 2, 3])
            calls = [ToolCall(id=f"call_{turn}_{j}", name="lookup", arguments='{"q": 1}')
                     for j in range(k)]
            out.append(Message.assistant(tool_calls=calls))
            for c in reversed(calls):  # results out of order
                out.append(Message.tool(text("result"), tool_call_id=c.id))
        out.append(Message.assistant(text(f"a{turn}")))
    return out


def assert_provider_valid(openai_messages: list[dict[str, Any]]) -> None:
    """Every tool message answers a call of the assistant message right before its run,
    and every call is answered."""
    pending: set[str] = set()
    for i, m in enumerate(openai_messages):
        if m["role"] == "tool":
            assert m["tool_call_id"] in pending, f"orphan tool result at {i}"
            pending.discard(m["tool_call_id"])
            continue
        assert not pending, f"unanswered calls {pending} before message {i}"
        if m.get("tool_calls"):
            pending = {c["id"] for c in m["tool_calls"]}
    assert not pending, f"unanswered calls {pending} at the end"


async def test_every_view_through_the_store_is_valid_and_pure(store: Any, counter: Any) -> None:
    msgs = conversation(40)
    await call(store.extend("c", msgs))
    await call(store.append("c", Message.assistant(tool_calls=[ToolCall(id="pending", name="f")])))
    await call(store.pin("c", 5))
    before = (await call(store.save_state("c"))).to_json()
    for view in VIEWS:
        window = await call(store.window("c", view))
        assert_provider_valid(window.to_openai())
        seqs = window.seqs
        assert seqs == sorted(seqs)
        assert 1 in seqs and 5 in seqs  # system and pinned kept
        assert window.messages[0].role == "system"
        assert window.report.conversation_message_count == len(msgs) + 1
        assert len(msgs) + 1 not in seqs  # the pending call never reaches the provider
        assert any(o.reason == "incomplete_unit" for o in window.report.omitted)
        if view.budgeted:
            assert window.budget == view.token_limit  # type: ignore[attr-defined]
            assert window.token_count + view.reserve <= view.token_limit  # type: ignore[attr-defined]
            assert window.token_count == counter.count_messages(window.messages)
        again = await call(store.window("c", view))
        assert again == window, f"{view} is not deterministic"
    assert (await call(store.save_state("c"))).to_json() == before, "a window wrote"


async def test_budget_error_carries_the_numbers(store: Any) -> None:
    await call(store.append("c", Message.system("word " * 50)))
    await call(store.append("c", Message.user("hi")))
    with pytest.raises(ContextBudgetError) as info:
        await call(store.window("c", TokenLimitedView(20)))
    assert info.value.budget == 20 and info.value.required > 20
    assert "20" in str(info.value)


async def test_view_with_its_own_counter_recounts_only_what_it_reads(store: Any) -> None:
    await call(store.extend("c", conversation(30)))
    approx = ApproxCounter(chars_per_token=2)
    window = await call(store.window("c", TokenLimitedView(80, counter=approx)))
    assert window.report.counter == approx.name
    assert window.token_count == approx.count_messages(window.messages)
    assert window.token_count <= 80
    # stored counts stay those of the store's counter
    stored = await call(store.messages("c", limit=3))
    assert {m.token_counter for m in stored} == {store.counter.name}


async def test_chat_context_round_trip(store: Any) -> None:
    view = TokenLimitedView(200, reserve=20)
    ctx = store.context("ctx", view)
    assert await call(ctx.get_messages()) == []
    for m in conversation(10):
        await call(ctx.add_message(m))
    window = await call(ctx.get_window())
    state = await call(ctx.save_state())
    assert state.view == view.to_config()
    assert view_from_config(state.view) == view
    assert await call(ctx.clear()) == len(conversation(10))
    assert await call(ctx.get_messages()) == []
    await call(ctx.load_state(state))
    assert await call(ctx.get_window()) == window


async def test_chat_context_saves_an_empty_state_before_its_first_message(store: Any) -> None:
    """A fresh context's messages are empty, and so is its snapshot (it raised
    ConversationNotFoundError); loading that snapshot back empties the context."""
    view = ScoreBasedView(token_limit=100, half_life=1e20, keep_rate=-0.0)
    ctx = store.context("fresh", view)
    state = await call(ctx.save_state())
    assert (state.conversation.id, state.messages, state.summaries) == ("fresh", [], [])
    # Float settings jsonb cannot hold as they are are written as equal values it can.
    assert state.view is not None and view_from_config(state.view) == view
    await call(ctx.add_message(Message.user("hello")))
    await call(ctx.load_state(state))
    assert await call(ctx.get_messages()) == []
    await call(store.delete_conversation("fresh"))
    assert (await call(ctx.save_state())).messages == []
    again = ConversationState.model_validate_json(state.model_dump_json())
    assert again.view == state.view


def _build(store: MemoryStore, cid: str, n_messages: int) -> None:
    msgs = conversation(n_messages // 2, seed=11, words=(20, 60))
    store.extend(cid, msgs[:n_messages])


@pytest.mark.slow
def test_window_reads_grow_with_the_window_not_the_history(db_url: str) -> None:
    counter = FixedCounter(per_message=3, per_word=1, per_tool_call=2, priming=3)
    # Without the row cache: every row a window needs is read and decoded here.
    store = MemoryStore(db_url, counter=counter, cache_size=0)
    _build(store, "long", 20_000)
    _build(store, "short", 600)
    for i in range(5):  # other conversations in the same tables
        store.extend(f"other-{i}", conversation(50, seed=i))

    statements: list[tuple[str, Any]] = []
    real_execute = _window.SQLHistory._execute

    def record(self: Any, name: str, values: dict[str, Any]) -> Any:
        # The window path runs precompiled SQL on the DBAPI cursor (no engine events).
        statements.append((_statements.hot(store.engine.dialect, name).sql, values))
        return real_execute(self, name, values)

    rows = {"n": 0}
    real = _window.decode_raw

    def counting(row: Any, dialect: str, cid: str) -> Any:
        rows["n"] += 1
        return real(row, dialect, cid)

    for view in (TokenLimitedView(4000), ScoreBasedView(4000), HeadAndTailView(20, 40)):
        results = {}
        for cid in ("short", "long"):
            statements.clear()
            rows["n"] = 0
            _window.SQLHistory._execute = record  # type: ignore[method-assign]
            _window.decode_raw = counting  # type: ignore[assignment]
            try:
                window = store.window(cid, view)
            finally:
                _window.decode_raw = real  # type: ignore[assignment]
                _window.SQLHistory._execute = real_execute  # type: ignore[method-assign]
            results[cid] = (len(window.messages), rows["n"], len(statements))
            # a row the view reads twice (ScoreBasedView's newest) is decoded once
            assert window.report.rows_read - 1 <= rows["n"] <= window.report.rows_read
            in_window = len(window.messages)
            assert rows["n"] <= 4 * in_window + 64, (view, cid, rows["n"], in_window)
            for sql, params in statements:
                if "memstore_messages" in sql:
                    # every read is scoped to one conversation and bounded
                    assert "conversation_id" in sql
                    flat = str(params)
                    assert cid in flat
                    assert "LIMIT" in sql.upper() or "seq <" in sql or "anchored" in sql
        # a 33x longer history reads about the same number of rows
        short_rows, long_rows = results["short"][1], results["long"][1]
        assert long_rows <= 2 * short_rows + 64, (view, results)
    store.close()


@pytest.mark.postgres
def test_state_moves_from_sqlite_to_postgres_with_the_same_windows(
    tmp_path: Any, pg_url: str
) -> None:
    from tests.conftest import _empty_pg

    _empty_pg(pg_url)
    counter = FixedCounter(per_message=3, per_word=1, per_tool_call=2, priming=3)
    lite = MemoryStore(f"sqlite:///{tmp_path / 'src.db'}", counter=counter)
    msgs = conversation(60)
    lite.extend("conv", msgs)
    lite.set_score("conv", 10, 40.0)
    lite.pin("conv", 20)
    lite.truncate("conv", before_seq=3)
    text = lite.save_state("conv").to_json()
    pg = MemoryStore(pg_url, counter=counter)
    pg.load_state(ConversationState.from_json(text))
    assert [m.model_dump() for m in pg.messages("conv")] == \
        [m.model_dump() for m in lite.messages("conv")]
    for view in VIEWS:
        assert pg.window("conv", view) == lite.window("conv", view), view
    lite.close()
    pg.close()


def test_hot_queries_use_the_indexes_on_sqlite(tmp_path: Any) -> None:
    from memstore._db import statements as q

    store = MemoryStore(f"sqlite:///{tmp_path / 'plan.db'}", counter=FixedCounter())
    store.extend("c", conversation(20))
    values = {"cid": "c", "start": 1, "stop": 5, "epoch": 1}
    with store.engine.connect() as conn:
        for name in ("conversation", "range", "range_checked"):
            compiled = q.hot(conn.dialect, name)
            params = compiled.params({k: v for k, v in values.items()
                                      if compiled.positions is None or k in compiled.positions})
            plan = " ".join(str(r) for r in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN " + compiled.sql, params).fetchall())
            assert "SCAN" not in plan, (name, plan)
            if name == "conversation":  # anchored messages come through the partial index
                assert "ix_memstore_messages_anchored" in plan, plan
    store.close()


# ---- the first page comes with the first statement --------------------------------------------


@pytest.mark.parametrize("view", [TokenLimitedView(600), ScoreBasedView(600, keep_rate=0.9),
                                  TokenLimitedView(600, start_on_user=True)],
                         ids=["token_limited", "score_based", "start_on_user"])
async def test_a_budgeted_window_reads_its_first_page_with_the_first_statement(
    store: Any, db_url: str, counter: FixedCounter, monkeypatch: Any, view: Any
) -> None:
    """PostgreSQL: the conversation row, its anchored messages and the newest page in one
    statement (one round trip); a warm window's statement brings only the rows appended
    since (the cache holds the rest). SQLite reads the row, then the page (no round
    trips there; two simple statements run faster than the compound one)."""
    from memstore.views.history import ListHistory

    writer = MemoryStore(db_url, counter=counter)
    writer.extend("c", conversation(150, seed=3))
    calls: list[str] = []
    real = _window.SQLHistory._execute

    def record(self: Any, name: str, values: dict[str, Any]) -> Any:
        calls.append(name)
        return real(self, name, values)

    monkeypatch.setattr(_window.SQLHistory, "_execute", record)
    if db_url.startswith("sqlite"):
        head, cold, warm = "conversation", ["conversation", "range_checked"], [
            "conversation", "range_checked"]
    else:
        head, cold, warm = "conversation_page", ["conversation_page"], ["conversation_page"]

    def same(a: Any, b: Any) -> bool:  # rows_read depends on how a source pages
        return bool(a.messages == b.messages and a.token_count == b.token_count
                    and a.report.omitted == b.report.omitted)

    exact = isinstance(view, TokenLimitedView)  # a score-based read may go further back
    first = await call(store.window("c", view))
    assert calls == cold if exact else calls[0] == head
    assert same(first, view.select(ListHistory(writer.messages("c")), counter))
    writer.extend("c", [Message.user("one more question"), Message.assistant("an answer")])
    calls.clear()
    before = store.cache_info()
    second = await call(store.window("c", view))
    after = store.cache_info()
    if exact:
        assert calls == warm
        assert after.misses - before.misses == 2  # only the appended rows were decoded
    else:
        assert calls[0] == head
    assert same(second, view.select(ListHistory(writer.messages("c")), counter))
    # Without a cache, a window its first page holds is one statement too.
    nocache = MemoryStore(db_url, counter=counter, cache_size=0)
    calls.clear()
    assert same(nocache.window("c", view), second)
    assert calls == cold if exact else calls[0] == head
    nocache.close()
    writer.close()


async def test_a_missing_conversation_is_an_empty_window_with_a_budget(store: Any) -> None:
    # The budgeted path's first statement also reads the first page (PostgreSQL): a
    # conversation it does not find is an empty window there too.
    window = await call(store.window("nobody", TokenLimitedView(600, reserve=599)))
    assert window.messages == [] and not window.report.conversation_exists


@pytest.mark.parametrize("view", [TokenLimitedView(600), TokenLimitedView(600, start_on_user=True),
                                  ScoreBasedView(600, keep_rate=0.9)],
                         ids=["token_limited", "start_on_user", "score_based"])
def test_a_window_builds_models_only_for_the_rows_it_takes(
    db_url: str, counter: FixedCounter, view: Any
) -> None:
    """A page is read whole but each row becomes a model only when the view takes it: the
    slack of the last page (and of a PostgreSQL first page) costs SQL, not decoding."""
    from memstore.views.history import ListHistory

    store = MemoryStore(db_url, counter=counter, cache_size=0)
    store.extend("c", conversation(150, seed=5))
    fetched = {"n": 0}
    real_execute = _window.SQLHistory._execute

    def record(self: Any, name: str, values: dict[str, Any]) -> Any:
        rows = real_execute(self, name, values)
        if name.startswith("range"):
            fetched["n"] += len(rows)
        elif name == "conversation_page":  # the page's rows (part 1) come with the head
            fetched["n"] += sum(1 for r in rows if r[6] != 0)
        return rows

    decoded = {"n": 0}
    real_decode = _window.decode_raw

    def counting(row: Any, dialect: str, cid: str) -> Any:
        decoded["n"] += 1
        return real_decode(row, dialect, cid)

    _window.SQLHistory._execute = record  # type: ignore[method-assign]
    _window.decode_raw = counting  # type: ignore[assignment]
    try:
        window = store.window("c", view)
    finally:
        _window.decode_raw = real_decode  # type: ignore[assignment]
        _window.SQLHistory._execute = real_execute  # type: ignore[method-assign]
    anchored = sum(1 for m in store.messages("c") if m.anchored)
    # Every model built was handed to the view (the anchored ones with the head; a row
    # the view reads twice, ScoreBasedView's newest, is decoded once); the first page's
    # slack was read but never decoded.
    assert window.report.rows_read - 1 <= decoded["n"] <= window.report.rows_read
    assert fetched["n"] > decoded["n"] - anchored
    expected = view.select(ListHistory(store.messages("c")), counter)
    assert window.messages == expected.messages
    assert window.report.omitted == expected.report.omitted
    store.close()


@pytest.mark.postgres
def test_a_window_past_its_prefetched_page_reads_doubling_pages(
    pg_url: str, counter: FixedCounter
) -> None:
    """PostgreSQL: the first page comes with the first statement; when the window needs
    more (small new messages after large old ones fool the mean-size estimate), the next
    reads are twice, then four times that page, so few round trips follow."""
    from memstore.views.history import ListHistory

    store = MemoryStore(pg_url, counter=counter, cache_size=0)
    big = " ".join(["word"] * 200)
    store.extend("skew", [Message.user(big) if i % 2 == 0 else Message.assistant(big)
                          for i in range(300)])
    store.extend("skew", [Message.user("hi") if i % 2 == 0 else Message.assistant("ok")
                          for i in range(200)])
    sizes: list[tuple[str, int]] = []
    real_execute = _window.SQLHistory._execute

    def record(self: Any, name: str, values: dict[str, Any]) -> Any:
        rows = real_execute(self, name, values)
        page = sum(1 for r in rows if r[6] != 0) if name == "conversation_page" else len(rows)
        sizes.append((name, page))
        return rows

    view = TokenLimitedView(3000)
    _window.SQLHistory._execute = record  # type: ignore[method-assign]
    try:
        window = store.window("skew", view)
    finally:
        _window.SQLHistory._execute = real_execute  # type: ignore[method-assign]
    assert window.messages == view.select(ListHistory(store.messages("skew")), counter).messages
    assert len(window.messages) > 200  # every small message and a few large ones
    (head, first), *follow = sizes
    assert head == "conversation_page" and first < 100
    assert [name for name, _ in follow] == ["range_checked"] * len(follow)
    assert [n for _, n in follow] == [first * 2 ** (i + 1) for i in range(len(follow))]
    assert len(follow) == 2  # 1 + 2 + 4 pages hold the 200 small messages and the large ones
    store.close()
