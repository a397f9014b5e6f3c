"""Fuzzing every entry point with hostile input, on SQLite and PostgreSQL.

Each input is either stored and read back exactly equal (same types, same values:
``1`` is not ``1.0``, ``-0.0`` is not ``0.0``), or rejected with a pydantic
``ValidationError`` or a ``MemstoreError`` and nothing is written. Any other
exception type escapes the ``except`` clauses below and fails the test.

Budget: derandomized, a few dozen examples per test; the whole file runs in well
under a minute on both databases.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pydantic
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from memstore import (
    AsyncMemoryStore,
    BufferedView,
    ContextView,
    HeadAndTailView,
    MemoryStore,
    RecentTurnsView,
    ScoreBasedView,
    TokenLimitedView,
    UnboundedView,
    view_from_config,
)
from memstore.errors import (
    ConfigurationError,
    ContextBudgetError,
    ConversationNotFoundError,
    InvalidInputError,
    MemstoreError,
)
from memstore.models import ConversationState, Message, StoredMessage, ToolCall
from memstore.tokens import FixedCounter
from memstore.views.window import ContextWindow
from tests.helpers import examples

REJECTED = (pydantic.ValidationError, MemstoreError)

FUZZ = settings(
    derandomize=True,
    database=None,
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
PURE = settings(FUZZ, max_examples=examples(150))

# ---- strategies ------------------------------------------------------------------------

HOSTILE_TEXT = ["", "\x00", "a\x00b", "\ud800", "a\udfff", "\udbff\udfff", "\ud83d\ude00",
                "\U0001f600", "é\u0301", "\u2028\ufeff", "\uffff", "x" * 256, "{n}", "'; --"]
#: Every character, surrogates and NUL included.
ANY_CHAR = st.characters(exclude_categories=())


def texts(max_size: int = 12) -> st.SearchStrategy[str]:
    """Any text: surrogates, NUL and other hostile strings often."""
    return st.one_of(
        st.text(max_size=max_size),
        st.text(ANY_CHAR, max_size=max_size),
        st.sampled_from(HOSTILE_TEXT),
    )


def clean_texts(max_size: int = 12) -> st.SearchStrategy[str]:
    """Storable text of every kind (astral characters, controls, combining marks...)."""
    return st.one_of(
        st.text(st.characters(exclude_characters="\x00"), max_size=max_size),
        st.sampled_from(["\U0001f600", "é\u0301", "\u2028\ufeff", "\uffff", "{n}", "'; --",
                         "\\u0000", "\x01\x7f"]),
    )


FLOATS = st.one_of(
    st.floats(),
    st.sampled_from([-0.0, 0.0, 1e16, -1e16, 9999999999999998.0, 1e308, 5e-324, 1e-300,
                     0.1, 1.5]),
)
INTS = st.one_of(
    st.integers(),
    st.sampled_from([0, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63) - 1, 2**64,
                     10**999, -(10**999), 10**1000]),
    # Beyond Python's int-to-str limit (even repr refuses it); built lazily so that
    # hypothesis can still describe the strategy.
    st.builds(lambda: 10**5000),
)
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, texts())
NOT_JSON = st.sampled_from([{1, 2}, b"bytes", datetime(2026, 1, 1), object, 1j])
JSON = st.recursive(
    SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(texts(6), children, max_size=3)),
    max_leaves=8,
)
METADATA = st.one_of(
    st.dictionaries(texts(6), JSON, max_size=4),
    st.dictionaries(texts(6), st.one_of(JSON, NOT_JSON), max_size=2),
    st.dictionaries(st.one_of(st.integers(), st.none()), JSON, min_size=1, max_size=1),
    st.sampled_from([None, [], "meta", 5]),
)
SCORES = st.one_of(FLOATS, INTS, st.sampled_from([2**1024, -(2**1024), "1.0", None]))
#: JSON both databases read back exactly (the accepted side of the rules).
CLEAN_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(),
              st.one_of(st.integers(), st.sampled_from([2**63, -(2**64), 10**999])),
              st.floats(allow_nan=False, allow_infinity=False, min_value=-9.99e15,
                        max_value=9.99e15).filter(lambda f: math.copysign(1.0, f) > 0 or f),
              st.sampled_from([5e-324, 9999999999999998.0, 1e-300, 0.1, 2.5]),
              clean_texts()),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(clean_texts(6), children, max_size=3)),
    max_leaves=8,
)
ROLES = ["system", "developer", "user", "assistant", "tool"]


@st.composite
def tool_calls(draw: st.DrawFn) -> Any:
    kind = draw(st.integers(0, 9))
    if kind <= 6:  # the OpenAI shape, with hostile strings
        return {"id": draw(texts()), "type": "function",
                "function": {"name": draw(texts()), "arguments": draw(texts(20))}}
    if kind == 7:  # a malformed shape
        return {"id": draw(texts()), "type": draw(st.sampled_from(["function", "custom", None, 5])),
                "function": draw(st.one_of(st.text(max_size=3), st.none(), st.integers(),
                                           st.fixed_dictionaries({"name": texts()})))}
    if kind == 8:
        return {"id": "c", "type": "custom", "custom": {"name": "f", "input": "x"}}
    return draw(st.one_of(st.none(), st.integers(), st.text(max_size=3)))


@st.composite
def content_parts(draw: st.DrawFn) -> Any:
    if draw(st.booleans()):
        return {"type": "text", "text": draw(texts(20))}
    image: dict[str, Any] = {"url": draw(texts(20))}
    if draw(st.booleans()):
        image["detail"] = draw(st.sampled_from(["auto", "low", "high", None, "huge"]))
    return {"type": "image_url", "image_url": image}


@st.composite
def clean_messages(draw: st.DrawFn) -> dict[str, Any]:
    """A valid OpenAI-style message dict, with every kind of storable value."""
    role = draw(st.sampled_from(ROLES))
    message: dict[str, Any] = {"role": role}
    if role == "assistant" and draw(st.booleans()):
        message["content"] = draw(st.one_of(st.none(), clean_texts(30)))
        message["tool_calls"] = [
            {"id": f"call-{i}-{draw(clean_texts(4))}", "type": "function",
             "function": {"name": draw(clean_texts(8).filter(bool)),
                          "arguments": draw(clean_texts(20))}}
            for i in range(draw(st.integers(1, 2)))
        ]
    elif role == "user" and draw(st.booleans()):
        message["content"] = [
            {"type": "text", "text": draw(clean_texts(20))} if draw(st.booleans()) else
            {"type": "image_url", "image_url": {"url": draw(clean_texts(20)), **(
                {"detail": draw(st.sampled_from(["auto", "low", "high"]))}
                if draw(st.booleans()) else {})}}
            for _ in range(draw(st.integers(0, 2)))
        ]
    else:
        message["content"] = draw(clean_texts(30))
    if role == "tool":
        message["tool_call_id"] = draw(clean_texts(8).filter(bool))
    if draw(st.booleans()):
        message["metadata"] = draw(st.dictionaries(clean_texts(6), CLEAN_JSON, max_size=3))
    if draw(st.integers(0, 3)) == 0:
        message["score"] = draw(st.one_of(st.floats(0, 1e300), st.integers(0, 2**70)))
    if draw(st.integers(0, 3)) == 0:
        message["id"] = draw(clean_texts(8).filter(bool))
    if draw(st.integers(0, 3)) == 0:
        message["name"] = draw(clean_texts(8).filter(bool))
    message["pinned"] = draw(st.booleans())
    return message


def messages() -> st.SearchStrategy[dict[str, Any]]:
    """Mostly valid messages, a third of them hostile."""
    return st.one_of(clean_messages(), clean_messages(), openai_messages())


@st.composite
def openai_messages(draw: st.DrawFn) -> dict[str, Any]:
    """An OpenAI-style message dict: mostly role-consistent, with hostile field values."""
    role = draw(st.sampled_from([*ROLES, "user", "user", "assistant", "robot"]))
    message: dict[str, Any] = {"role": role}
    shape = draw(st.integers(0, 9))
    if shape <= 5:
        message["content"] = draw(texts(30))
    elif shape <= 7:
        message["content"] = draw(st.lists(content_parts(), max_size=3))
    elif shape == 8:
        message["content"] = None
    else:
        message["content"] = draw(st.sampled_from([5, {"text": "x"}, ["x"]]))
    if role == "assistant" and draw(st.booleans()):
        message["tool_calls"] = draw(st.lists(tool_calls(), max_size=2))
    if role == "tool" or draw(st.integers(0, 9)) == 0:
        message["tool_call_id"] = draw(texts())
    for key, strategy in (("name", texts()), ("score", SCORES), ("pinned", st.booleans()),
                          ("metadata", METADATA), ("id", texts())):
        if draw(st.integers(0, 3)) == 0:
            message[key] = draw(strategy)
    if draw(st.integers(0, 19)) == 0:
        message[draw(st.sampled_from(["refusal", "audio", "colour"]))] = draw(
            st.sampled_from([None, "", "x"]))
    return message


# ---- exact comparison ------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Equal in value *and* type, recursively (``1 != 1.0``, ``-0.0 != 0.0`` here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return bool(a == b)


def caller_fields(message: Message, *, with_id: bool = True) -> dict[str, Any]:
    fields = message.as_message().model_dump() if isinstance(message, StoredMessage) \
        else message.model_dump()
    if not with_id:
        fields.pop("id")
    return fields


def assert_stored_as_sent(stored: StoredMessage, sent: Message, *, retry: bool = False) -> None:
    """``stored`` holds exactly what ``sent`` carried.

    For a retry (a client id already written) the store returns the first write:
    score and pinned are not part of the idempotency comparison.
    """
    expected = caller_fields(sent, with_id=sent.id is not None)
    actual = caller_fields(stored, with_id=sent.id is not None)
    if retry:
        for name in ("score", "pinned"):
            expected.pop(name)
            actual.pop(name)
    assert same(actual, expected), (actual, expected)


def assert_same_stored(a: StoredMessage, b: StoredMessage) -> None:
    assert same(a.model_dump(), b.model_dump()), (a, b)


# ---- stores: sync and async, both databases ----------------------------------------------


class Driver:
    """Runs a MemoryStore or an AsyncMemoryStore with the same synchronous calls."""

    def __init__(self, store: Any, loop: asyncio.AbstractEventLoop | None) -> None:
        self.store = store
        self.loop = loop

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.store, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            if inspect.isawaitable(result):
                assert self.loop is not None
                return self.loop.run_until_complete(result)
            return result

        return run


COUNTER = FixedCounter(per_message=3, per_word=1, per_tool_call=2, priming=3)


@pytest.fixture(params=["sync", "async"])
def driver(request: pytest.FixtureRequest, db_url: str) -> Iterator[Driver]:
    if request.param == "sync":
        sync_store = MemoryStore(db_url, counter=COUNTER)
        yield Driver(sync_store, None)
        sync_store.close()
        return
    loop = asyncio.new_event_loop()
    async_store = AsyncMemoryStore(db_url, counter=COUNTER)
    loop.run_until_complete(async_store.setup())
    yield Driver(async_store, loop)
    loop.run_until_complete(async_store.close())
    loop.close()


@pytest.fixture
def sync_driver(db_url: str) -> Iterator[Driver]:
    store = MemoryStore(db_url, counter=COUNTER)
    yield Driver(store, None)
    store.close()


def fresh_id() -> str:
    return f"fuzz-{uuid.uuid4().hex}"


def assert_absent(d: Driver, cid: str) -> None:
    with pytest.raises(ConversationNotFoundError):
        d.get_conversation(cid)


VIEWS: list[ContextView] = [
    UnboundedView(),
    BufferedView(buffer_size=2),
    HeadAndTailView(head_size=1, tail_size=1),
    TokenLimitedView(token_limit=60),
    ScoreBasedView(token_limit=60, keep_rate=0.5),
    RecentTurnsView(max_turns=1, remove_tool_messages=True),
]


def check_windows(d: Driver, cid: str, stored: list[StoredMessage]) -> None:
    """Every view's window holds messages exactly as stored (or the budget is refused)."""
    by_seq = {m.seq: m for m in stored}
    for view in VIEWS:
        try:
            window = d.window(cid, view)
        except ContextBudgetError:
            continue
        assert isinstance(window, ContextWindow)
        for m in window.messages:
            if isinstance(m, StoredMessage):
                assert_same_stored(m, by_seq[m.seq])


# ---- messages (no database) ---------------------------------------------------------------


@PURE
@given(data=messages())
def test_from_openai_accepts_exactly_or_rejects(data: dict[str, Any]) -> None:
    try:
        message = Message.from_openai(data)
    except pydantic.ValidationError:
        event("rejected")
        return
    event("accepted")
    # An accepted message survives JSON and the OpenAI shape unchanged.
    assert same(Message.model_validate_json(message.model_dump_json()).model_dump(),
                message.model_dump())
    extra = {"score": message.score, "pinned": message.pinned,
             "metadata": message.metadata, "id": message.id}
    if message.role == "tool":  # a tool message's name is stored, never sent to OpenAI
        extra["name"] = message.name
    again = Message.from_openai(message.to_openai(), **extra)
    if message.content is None and not message.tool_calls:
        # the OpenAI shape has no "no content, no calls": it is sent as ""
        assert again.content == ""
        again = again.model_copy(update={"content": None})
    assert same(again.model_dump(), message.model_dump())
    json.dumps(message.model_dump(), allow_nan=False)


@PURE
@given(fields=st.fixed_dictionaries({}, optional={
    "role": st.one_of(st.sampled_from(ROLES), texts()),
    "content": st.one_of(texts(), st.lists(content_parts(), max_size=2), st.none(), INTS),
    "name": st.one_of(texts(), st.none()),
    "tool_calls": st.one_of(st.none(), st.lists(tool_calls(), max_size=2)),
    "tool_call_id": st.one_of(texts(), st.none()),
    "score": SCORES,
    "pinned": st.one_of(st.booleans(), texts()),
    "metadata": METADATA,
    "id": st.one_of(texts(), st.none()),
}))
def test_message_constructor_accepts_exactly_or_rejects(fields: dict[str, Any]) -> None:
    try:
        message = Message(**fields)
    except pydantic.ValidationError:
        return
    assert same(Message.model_validate_json(message.model_dump_json()).model_dump(),
                message.model_dump())


# ---- append / extend / read back ----------------------------------------------------------


@settings(FUZZ, max_examples=examples(80))
@given(batch=st.lists(messages(), min_size=1, max_size=4), prior=st.booleans(),
       one=st.booleans())
def test_append_and_extend_store_exactly_or_write_nothing(
    driver: Driver, batch: list[dict[str, Any]], prior: bool, one: bool
) -> None:
    cid = fresh_id()
    if prior:
        driver.append(cid, Message.user("before"))
    before = driver.messages(cid) if prior else []
    batch = batch[:1] if one else batch
    try:
        expected = [Message.from_openai(m) for m in batch]
    except pydantic.ValidationError:
        expected = None
    try:
        stored = [driver.append(cid, batch[0])] if one else driver.extend(cid, batch)
    except REJECTED as exc:
        event(f"rejected: {type(exc).__name__}")
        # Rejected exactly when a message is invalid (or its client id conflicts).
        assert expected is None or not isinstance(exc, pydantic.ValidationError), exc
        if prior:
            assert driver.messages(cid) == before
        else:
            assert_absent(driver, cid)
        return
    assert expected is not None, "an invalid message was stored"
    event("stored")
    assert len(stored) == len(expected)
    seen: set[str] = set()
    for s, m in zip(stored, expected):
        assert_stored_as_sent(s, m, retry=m.id in seen)
        if m.id is not None:
            seen.add(m.id)
    read = driver.messages(cid)
    assert len(read) == len(before) + len({s.seq for s in stored})
    by_seq = {m.seq: m for m in read}
    for s in stored:
        assert_same_stored(by_seq[s.seq], s)
        assert_same_stored(driver.get_message(cid, s.seq), s)
    check_windows(driver, cid, read)
    # A snapshot moves through JSON and into another conversation unchanged.
    state = driver.save_state(cid)
    text = state.to_json()
    target = fresh_id()
    driver.load_state(text, target)
    copied = driver.messages(target)
    assert len(copied) == len(read)
    for a, b in zip(copied, read):
        assert same(a.model_dump(exclude={"conversation_id"}),
                    b.model_dump(exclude={"conversation_id"}))
    driver.delete_conversation(cid)
    driver.delete_conversation(target)


# ---- conversation ids and metadata ---------------------------------------------------------

IDS = st.one_of(texts(20), st.sampled_from(["x" * 255, "x" * 256, None, 5, b"id", ("a",)]))


@FUZZ
@given(cid=IDS, metadata=METADATA, seq=st.one_of(INTS, st.sampled_from([True, 1.0, "1"])))
def test_conversation_ids_round_trip_or_are_refused(
    sync_driver: Driver, cid: Any, metadata: Any, seq: Any
) -> None:
    d = sync_driver
    try:
        conversation = d.create_conversation(cid, metadata)
    except REJECTED as exc:
        event(f"rejected: {type(exc).__name__}")
        assert isinstance(exc, (InvalidInputError, pydantic.ValidationError)), exc
        if isinstance(cid, str):
            try:
                d.get_conversation(cid)
            except ConversationNotFoundError:
                pass
            except InvalidInputError:
                pass
            else:
                pytest.fail(f"{cid!r} exists after a refused create")
        return
    event("created")
    cid = conversation.id
    try:
        got = d.get_conversation(cid)
        assert got.id == cid
        assert same(got.metadata, conversation.metadata)
        assert same(dict(got.metadata), dict(metadata or {}))
        assert cid in [c.id for c in d.list_conversations(limit=10_000)]
        d.list_conversations(after=cid)
        d.append(cid, Message.user("x"))
        with contextlib.suppress(*REJECTED):
            d.get_message(cid, seq)
        assert [m.conversation_id for m in d.messages(cid)] == [cid]
        check_windows(d, cid, d.messages(cid))
    finally:
        d.delete_conversation(cid)


@FUZZ
@given(cid=IDS, after=st.one_of(texts(20), st.none(), INTS),
       start=st.one_of(st.none(), INTS), stop=st.one_of(st.none(), INTS),
       limit=st.one_of(st.none(), INTS), n=INTS)
def test_reads_take_any_argument_without_escaping(
    sync_driver: Driver, cid: Any, after: Any, start: Any, stop: Any, limit: Any, n: Any
) -> None:
    d = sync_driver
    calls: list[Callable[[], Any]] = [
        lambda: d.list_conversations(after=after),
        lambda: d.messages(cid, start=start, stop=stop, limit=limit),
        lambda: d.get_message(cid, n),
        lambda: d.count_tokens(cid),
        lambda: d.window(cid, UnboundedView()),
        lambda: d.save_state(cid),
        lambda: d.truncate(cid, before_seq=n),
        lambda: d.pop(cid, n),
        lambda: d.set_score(cid, n, 1.0),
        lambda: d.pin(cid, n),
    ]
    for fn in calls:
        with contextlib.suppress(*REJECTED):
            fn()


# ---- load_state with mutated snapshots -------------------------------------------------------

MUTANTS = st.one_of(
    JSON,
    st.sampled_from([2**63 - 1, 2**62, 2**62 + 1, 2**31 - 1, 2**31, -1, 0, "", "\ud800", "a\x00",
                     "x" * 300, "2026-13-01T00:00:00Z", "0001-01-01T00:00:00+05:00",
                     "9999-12-31T23:59:59-05:00", "2026-01-01T00:00:00", float("nan"),
                     {"\ud800": 1}, {"f": 1e308}, "y" * 65]),
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*prefix, i))


def _base_state() -> dict[str, Any]:
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    messages = [
        Message.system("be brief"),
        Message.user("hello there", metadata={"k": [1, 2.5, None, True]}),
        Message.assistant(None, tool_calls=[ToolCall(id="c1", name="f", arguments="{}")]),
        Message.tool("42", tool_call_id="c1"),
        Message.assistant("done", score=2.0, pinned=True),
    ]
    stored = [
        StoredMessage(**m.model_dump(exclude={"id"}), id=f"m{i}", conversation_id="base",
                      seq=i + 1, created_at=t0 + timedelta(seconds=i),
                      token_count=COUNTER.count_message(m), token_counter=COUNTER.name)
        for i, m in enumerate(messages)
    ]
    state = ConversationState(
        conversation={"id": "base", "created_at": t0, "updated_at": t0,
                      "metadata": {"owner": "fuzz"}, "message_count": 5, "token_count": 0},
        messages=stored, view=TokenLimitedView(token_limit=100).to_config(),
    )
    snapshot: dict[str, Any] = json.loads(state.to_json())
    return snapshot


@FUZZ
@given(data=st.data())
def test_load_state_with_mutated_snapshots(driver: Driver, data: st.DataObject) -> None:
    snapshot = _base_state()
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(list(_paths(snapshot))[1:]))
        parent = snapshot
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.integers(0, 5)) == 0 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(MUTANTS)
    as_text = data.draw(st.booleans())
    payload: Any = snapshot
    if as_text:
        try:
            payload = json.dumps(snapshot)
        except ValueError:  # NaN etc. are not JSON text: load the dict itself
            payload = snapshot
    target = fresh_id()
    try:
        expected = ConversationState.model_validate(snapshot)
    except pydantic.ValidationError:
        expected = None
    try:
        driver.load_state(payload, target)
    except REJECTED as exc:
        event(f"rejected: {type(exc).__name__}")
        assert_absent(driver, target)
        return
    assert expected is not None, "an invalid snapshot was loaded"
    event("loaded")
    loaded = driver.messages(target)
    assert len(loaded) == len(expected.messages)
    # Token counts are the store's to verify or recompute; everything else is kept.
    volatile = {"conversation_id", "token_count", "token_counter"}
    for got, want in zip(loaded, expected.messages):
        assert same(got.model_dump(exclude=volatile), want.model_dump(exclude=volatile))
    conversation = driver.get_conversation(target)
    assert same(conversation.metadata, expected.conversation.metadata)
    check_windows(driver, target, loaded)
    driver.save_state(target).to_json()
    driver.delete_conversation(target)


# ---- views: construction, configuration, windows --------------------------------------------

PARAMS = st.one_of(
    INTS, FLOATS, st.booleans(), st.none(), texts(),
    st.sampled_from(["{n}", "{messages}", "{n:>200000000}", "{0}", "{", "}", "{n.real}",
                     "{n!r:>5} {messages:^9}", "{n:.150f}", "{n:{n}}", "Skipped {n}\x00",
                     "{messages:d}", "z" * 3000, 10**400, 2**53, 2**53 - 1]),
    st.lists(st.one_of(st.just({"type": "function", "function": {"name": "f"}}),
                       JSON), max_size=2),
    st.just(FixedCounter(per_message=1)),
)
VIEW_PARAMS: dict[type[ContextView], dict[str, bool]] = {
    UnboundedView: {},
    BufferedView: {"buffer_size": True},
    HeadAndTailView: {"head_size": True, "tail_size": True, "placeholder_template": False,
                      "placeholder_role": False},
    TokenLimitedView: {"token_limit": True, "reserve": False, "tools": False,
                       "start_on_user": False, "counter": False},
    ScoreBasedView: {"token_limit": True, "keep_rate": False, "half_life": False,
                     "reserve": False, "tools": False, "counter": False, "fill_scan": False},
    RecentTurnsView: {"max_turns": True, "remove_tool_messages": False},
}
HISTORY = [
    StoredMessage(**m.model_dump(), conversation_id="v", seq=i + 1,
                  created_at=datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=i),
                  token_count=COUNTER.count_message(m), token_counter=COUNTER.name)
    for i, m in enumerate([Message.system("s", id="m0"), *(
        Message.user(f"question {i}", id=f"u{i}") if i % 2 else
        Message.assistant(f"answer {i}", id=f"a{i}") for i in range(1, 12))])
]


@PURE
@given(kind=st.sampled_from(list(VIEW_PARAMS)), data=st.data())
def test_view_construction_config_and_window(kind: type[ContextView], data: st.DataObject) -> None:
    kwargs: dict[str, Any] = {}
    hostile = data.draw(st.booleans())
    for name, required in VIEW_PARAMS[kind].items():
        if required:
            kwargs[name] = data.draw(PARAMS if hostile and data.draw(st.booleans())
                                     else st.integers(1, 400))
        elif hostile and data.draw(st.booleans()):
            kwargs[name] = data.draw(PARAMS)
    try:
        view = kind(**kwargs)
    except ConfigurationError:
        event("rejected")
        return
    event("constructed")
    config = view.to_config()
    text = json.dumps(config, allow_nan=False)
    rebuilt = view_from_config(json.loads(text))
    assert rebuilt.to_config() == config
    try:
        window = view.apply(HISTORY, COUNTER)
    except ContextBudgetError:
        return
    for m in window.messages:
        if isinstance(m, StoredMessage):
            assert m in HISTORY
        else:
            assert len(m.text) <= 2000


@PURE
@given(config=st.one_of(
    st.dictionaries(st.one_of(st.sampled_from(["type", "token_limit", "buffer_size", "counter",
                                               "placeholder_template", "head_size",
                                               "tail_size", "max_turns", "keep_rate",
                                               "tools", "bogus"]), st.integers()),
                    st.one_of(PARAMS, st.sampled_from([
                        *(cls.__name__ for cls in VIEW_PARAMS), "approx/1e400",
                        "tiktoken/\ud800", "fixed/1/2/3/4/5", "approx/nan", "x" * 300])),
                    max_size=5),
    st.sampled_from([None, [], "TokenLimitedView", 5]),
))
def test_view_from_config_builds_or_refuses(config: Any) -> None:
    try:
        view = view_from_config(config)
    except ConfigurationError:
        return
    except MemstoreError as exc:  # a counter encoding unavailable offline, say
        assert not isinstance(exc, ConfigurationError)
        return
    assert view_from_config(json.loads(json.dumps(view.to_config()))).to_config() == \
        view.to_config()
