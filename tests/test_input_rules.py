"""The input rules, case by case: each input is stored exactly or refused by name.

One example per observed failure (strings that cannot be encoded, numbers that
change, raw exceptions, backends that disagree, URLs); the fuzzers in
``tests/test_fuzz.py`` cover the classes these examples belong to.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Any

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstore import (
    AsyncMemoryStore,
    ConversationState,
    HeadAndTailView,
    MemoryStore,
    Message,
    ScoreBasedView,
    TokenLimitedView,
    view_from_config,
)
from memstore.cli import main
from memstore.errors import (
    ConfigurationError,
    ConflictError,
    ConversationNotFoundError,
    InvalidInputError,
    MessageNotFoundError,
    MissingDependencyError,
)
from memstore.models import ImagePart, ImageURL, StoredMessage
from memstore.tokens import FixedCounter
from tests.helpers import Cases, call, examples

SURROGATE = "a\ud800"


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"k": value}
    return value


def tool_call(call_id: str = "c1", name: str = "f", arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# ---- strings that cannot be encoded ---------------------------------------------------------

BAD_STRINGS = [
    ("content", {"role": "user", "content": SURROGATE}),
    ("name", {"role": "user", "content": "x", "name": SURROGATE}),
    ("id", {"role": "user", "content": "x", "id": SURROGATE}),
    ("tool_call_id", {"role": "tool", "content": "x", "tool_call_id": SURROGATE}),
    ("tool_calls.0.id", {"role": "assistant", "tool_calls": [tool_call(call_id=SURROGATE)]}),
    ("tool_calls.0.name", {"role": "assistant", "tool_calls": [tool_call(name=SURROGATE)]}),
    ("tool_calls.0.arguments",
     {"role": "assistant", "tool_calls": [tool_call(arguments='{"a": "\udfff"}')]}),
    ("content", {"role": "user", "content": [{"type": "text", "text": SURROGATE}]}),
    ("content", {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/\x00.png"}}]}),
    ("content", {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/\ud800.png"}}]}),
    ("metadata", {"role": "user", "content": "x", "metadata": {"k": "\ud800\udfff"}}),
    ("metadata", {"role": "user", "content": "x", "metadata": {"\ud800": 1}}),
    ("metadata", {"role": "user", "content": "x", "metadata": {"k": ["a\x00"]}}),
    ("metadata", {"role": "user", "content": "x", "metadata": {"k\x00": 1}}),
]


async def test_unencodable_strings_are_refused_naming_the_field(store: Any) -> None:
    """Each message of BAD_STRINGS is refused naming its field. The cases share one store,
    each writing to its own conversation ``c<i>`` (which must not come to exist); a
    failure names every failing case (``<i>-<field>``)."""
    cases = Cases()
    for i, (field, bad) in enumerate(BAD_STRINGS):
        with cases.case(f"{i}-{field}"):
            with pytest.raises(pydantic.ValidationError) as info:
                await call(store.append(f"c{i}", bad))
            errors = info.value.errors()
            assert any(".".join(map(str, e["loc"])).startswith(field) for e in errors), errors
            assert "surrogate" in str(info.value) or "NUL" in str(info.value)
            with pytest.raises(ConversationNotFoundError):
                await call(store.get_conversation(f"c{i}"))
    cases.check()


def test_the_rule_is_the_same_in_every_model() -> None:
    with pytest.raises(pydantic.ValidationError, match="NUL"):
        ImageURL(url="data:image/png;base64,\x00")
    with pytest.raises(pydantic.ValidationError, match="surrogate"):
        ImagePart(image_url={"url": "\udc80"})
    with pytest.raises(pydantic.ValidationError):  # the JSON parser refuses it already
        Message.model_validate_json('{"role": "user", "content": "\\ud800"}')
    # A real astral character (a valid surrogate *pair* in JSON) is fine.
    assert Message.model_validate_json(
        '{"role": "user", "content": "\\ud83d\\ude00"}').content == "\U0001f600"


async def test_conversation_ids_that_cannot_be_encoded_are_refused_by_every_method(
    store: Any
) -> None:
    await call(store.append("ok", Message.user("x")))
    for cid in ("\ud800", "a\x00"):
        for method, args in (
            ("append", (cid, Message.user("x"))),
            ("extend", (cid, [Message.user("x")])),
            ("messages", (cid,)),
            ("get_message", (cid, 1)),
            ("get_conversation", (cid,)),
            ("create_conversation", (cid,)),
            ("delete_conversation", (cid,)),
            ("count_tokens", (cid,)),
            ("window", (cid, TokenLimitedView(token_limit=100))),
            ("save_state", (cid,)),
            ("clear", (cid,)),
        ):
            with pytest.raises(InvalidInputError, match="conversation id"):
                await call(getattr(store, method)(*args))
        with pytest.raises(InvalidInputError):
            await call(store.list_conversations(after=cid))
        state = await call(store.save_state("ok"))
        with pytest.raises(InvalidInputError):
            await call(store.load_state(state, cid))
    assert [c.id for c in await call(store.list_conversations())] == ["ok"]


# ---- numbers that change --------------------------------------------------------------------

CHANGING = [
    ({"f": 1e308}, "1e16 or more"),
    ({"f": 1e16}, "1e16 or more"),
    ({"f": -2.5e20}, "1e16 or more"),
    ({"z": -0.0}, "-0.0"),
    ({"n": float("nan")}, "not valid JSON"),
    ({"n": [float("inf")]}, "not valid JSON"),
    ({"i": 10**1000}, "digits"),
]


async def test_numbers_a_database_would_change_are_refused(store: Any) -> None:
    """Each metadata of CHANGING is refused naming the problem. The cases share one store,
    each writing to its own conversation ``c<i>`` (which must not come to exist); a
    failure names every failing case."""
    cases = Cases()
    for i, (metadata, needle) in enumerate(CHANGING):
        cid = f"c{i}"
        with cases.case(str(metadata)):
            with pytest.raises(pydantic.ValidationError, match="metadata") as info:
                await call(store.append(cid, Message.user("x", metadata=metadata)))
            assert needle in str(info.value)
            with pytest.raises(InvalidInputError, match=needle):
                await call(store.create_conversation(cid, metadata))
            with pytest.raises(ConversationNotFoundError):
                await call(store.get_conversation(cid))
    cases.check()


EXACT = {
    "largest": 9999999999999998.0,
    "tiny": 5e-324,
    "small": 1e-300,
    "third": 1 / 3,
    "int64": 2**63 - 1,
    "beyond": 2**64 + 1,
    "huge": 10**999,
    "negative": -(10**30),
    "one": 1,
    "one-float": 1.0,
    "zero": 0.0,
    "nested": [{"a": [None, True, False, "", "\U0001f600", "\\u0000"]}],
}


def _json_type(value: Any) -> type:
    return dict if isinstance(value, dict) else list if isinstance(value, list) else type(value)


async def test_numbers_inside_the_rules_read_back_exactly(store: Any) -> None:
    stored = await call(store.append("c", Message.user("x", metadata=EXACT)))
    await call(store.create_conversation("d", EXACT))
    for metadata in (
        (await call(store.get_message("c", 1))).metadata,
        (await call(store.messages("c")))[0].metadata,
        (await call(store.window("c", TokenLimitedView(token_limit=100)))).messages[0].metadata,
        (await call(store.get_conversation("d"))).metadata,
        stored.metadata,
    ):
        assert json.dumps(metadata, sort_keys=True) == json.dumps(EXACT, sort_keys=True)
        # (a message's nested values read back as read-only dict/list subclasses)
        assert {k: _json_type(v) for k, v in metadata.items()} == {
            k: type(v) for k, v in EXACT.items()}
    text = (await call(store.save_state("c"))).to_json()
    assert ConversationState.from_json(text).messages[0].metadata == EXACT


async def test_load_state_validates_conversation_metadata(store: Any) -> None:
    await call(store.append("c", Message.user("x")))
    snapshot = json.loads((await call(store.save_state("c"))).to_json())
    for bad in (float("nan"), float("inf"), 1e300, -0.0, deep(100)):
        snapshot["conversation"]["metadata"] = {"v": bad}
        with pytest.raises(pydantic.ValidationError, match="metadata"):
            await call(store.load_state(snapshot, "copy"))
    snapshot["conversation"]["metadata"] = {"v": 1}
    text = json.dumps(snapshot).replace('{"v": 1}', '{"v": NaN}')
    with pytest.raises(pydantic.ValidationError):
        await call(store.load_state(text, "copy"))
    with pytest.raises(ConversationNotFoundError):
        await call(store.get_conversation("copy"))


# ---- raw exceptions become memstore errors or ValidationErrors --------------------------------


async def test_deeply_nested_json_is_refused_everywhere(store: Any) -> None:
    nested = deep(1500)
    with pytest.raises(pydantic.ValidationError, match="nested more than 64 levels"):
        Message.user("x", metadata=nested)
    with pytest.raises(InvalidInputError, match="nested more than 64 levels"):
        await call(store.create_conversation("c", nested))
    with pytest.raises(ConfigurationError, match="nested more than 64 levels"):
        TokenLimitedView(token_limit=100, tools=[nested])
    Message.user("x", metadata=deep(63))  # the limit itself is fine
    await call(store.append("c", Message.user("x", metadata=deep(63))))
    assert (await call(store.messages("c")))[0].metadata == deep(63)
    snapshot = json.loads((await call(store.save_state("c"))).to_json())
    snapshot["messages"][0]["metadata"] = deep(1500)
    with pytest.raises(pydantic.ValidationError):
        await call(store.load_state(snapshot, "copy"))


async def test_overflowing_numbers_are_refused(store: Any) -> None:
    await call(store.append("c", Message.user("x")))
    with pytest.raises(InvalidInputError, match="score"):
        await call(store.set_score("c", 1, 2**1024))
    with pytest.raises(pydantic.ValidationError, match="score"):
        Message.user("x", score=2**1024)
    with pytest.raises(ConfigurationError, match="token_limit"):
        TokenLimitedView(token_limit=10**400)
    with pytest.raises(ConfigurationError, match="keep_rate"):
        ScoreBasedView(token_limit=100, keep_rate=10**400)
    with pytest.raises(ConfigurationError, match="half_life"):
        ScoreBasedView(token_limit=100, half_life=10**400)
    assert (await call(store.get_message("c", 1))).score == 1.0


async def test_integers_too_long_to_print_are_refused_by_name(store: Any) -> None:
    huge = 10**5000  # beyond Python's int-to-str limit: even repr() refuses it
    await call(store.append("c", Message.user("x")))
    with pytest.raises(InvalidInputError, match="seq"):
        await call(store.get_message("c", huge))
    with pytest.raises(InvalidInputError, match="limit"):
        await call(store.list_conversations(limit=huge))
    with pytest.raises(InvalidInputError, match="score"):
        await call(store.set_score("c", 1, huge))
    with pytest.raises(pydantic.ValidationError, match="score"):
        Message.user("x", score=huge)
    with pytest.raises(pydantic.ValidationError, match="metadata"):
        Message.user("x", metadata={"n": huge})
    with pytest.raises(ConfigurationError, match="view type"):
        view_from_config({"type": huge})
    with pytest.raises(ConfigurationError, match="busy_timeout"):
        MemoryStore("sqlite://", busy_timeout=huge)


async def test_out_of_range_seqs_get_the_same_error_on_both_databases(store: Any) -> None:
    await call(store.append("c", Message.user("x")))
    for seq in (2**64, 2**63, 2**63 - 1, 2**62 + 1):
        for method in ("get_message", "pin", "unpin"):
            with pytest.raises(InvalidInputError, match="2\\*\\*62"):
                await call(getattr(store, method)("c", seq))
        with pytest.raises(InvalidInputError, match="2\\*\\*62"):
            await call(store.set_score("c", seq, 1.0))
    with pytest.raises(MessageNotFoundError):
        await call(store.get_message("c", 2**62))
    # Range bounds and counts beyond every seq mean "all of them".
    assert len(await call(store.messages("c", start=-(2**70), stop=2**70, limit=2**80))) == 1
    assert await call(store.messages("c", start=2**64)) == []
    assert await call(store.truncate("c", before_seq=2**64)) == 1
    await call(store.append("c", Message.user("y")))
    assert len(await call(store.pop("c", 2**70))) == 1


async def test_extend_with_a_non_iterable_is_an_invalid_input(store: Any) -> None:
    for bad in (5, None, 1.5, object()):
        with pytest.raises(InvalidInputError, match="extend"):
            await call(store.extend("c", bad))
    with pytest.raises(ConversationNotFoundError):
        await call(store.get_conversation("c"))


@pytest.mark.parametrize("item", [
    {"id": "c1", "type": "function", "function": "f"},
    {"id": "c1", "type": "function", "function": None},
    {"id": "c1", "type": "function", "function": ["f", "{}"]},
    {"id": "c1", "type": "custom", "custom": {"name": "f", "input": "x"}},
    {"id": "c1", "type": "custom", "function": {"name": "f", "arguments": "{}"}},
    "c1",
    5,
])
def test_from_openai_refuses_malformed_tool_calls_with_a_validation_error(item: Any) -> None:
    with pytest.raises(pydantic.ValidationError, match="tool_calls"):
        Message.from_openai({"role": "assistant", "tool_calls": [item]})


def test_from_openai_refuses_non_lists_and_non_mappings_with_a_validation_error() -> None:
    with pytest.raises(pydantic.ValidationError, match="tool_calls"):
        Message.from_openai({"role": "assistant", "tool_calls": 5})
    with pytest.raises(pydantic.ValidationError):
        Message.from_openai(5)  # type: ignore[arg-type]
    with pytest.raises(pydantic.ValidationError, match="custom"):
        Message.from_openai({"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "custom", "custom": {}}]})


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1, 10**400, "30", None])
async def test_busy_timeout_is_validated(tmp_path: Any, timeout: Any) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(ConfigurationError, match="busy_timeout"):
        MemoryStore(url, busy_timeout=timeout)
    with pytest.raises(ConfigurationError, match="busy_timeout"):
        AsyncMemoryStore(url, busy_timeout=timeout)
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("template", [
    "{n:>200000000}", "{n:.100000f}", "{n:{n}}", "{0}", "{}", "{n.real}", "{n[0]}",
    "{messages.upper}", "{other}", "{", "Skipped {n}\x00", "Skipped {n} \ud800",
    "x" * 2001, "{n:>150}" * 20, 5,
])
def test_placeholder_templates_are_bounded_at_construction(template: Any) -> None:
    with pytest.raises(ConfigurationError, match="placeholder_template"):
        HeadAndTailView(head_size=1, tail_size=1, placeholder_template=template)
    with pytest.raises(ConfigurationError):
        view_from_config({"type": "HeadAndTailView", "head_size": 1, "tail_size": 1,
                          "placeholder_template": template})


def test_bounded_templates_still_format() -> None:
    view = HeadAndTailView(head_size=1, tail_size=1,
                           placeholder_template="[{n:>6,}] {messages!s:^10} {{n}}")
    assert view.placeholder_text(1234) == "[ 1,234]  messages  {n}"


# ---- backends that disagree -----------------------------------------------------------------


class LongNameCounter(FixedCounter):
    @property
    def name(self) -> str:
        return "x" * 65


class HugeCounter(FixedCounter):
    def count_message(self, message: Message) -> int:
        return 2**31


async def test_counter_names_longer_than_the_column_are_refused(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(ConfigurationError, match="64"):
        MemoryStore(url, counter=LongNameCounter(per_message=1))
    with pytest.raises(ConfigurationError, match="64"):
        AsyncMemoryStore(url, counter=LongNameCounter(per_message=1))


async def test_token_counts_beyond_the_column_write_nothing(db_url: str) -> None:
    store = MemoryStore(db_url, counter=HugeCounter(per_message=1))
    try:
        with pytest.raises(InvalidInputError, match="2147483647"):
            store.append("c", Message.user("x"))
        with pytest.raises(ConversationNotFoundError):
            store.get_conversation("c")
    finally:
        store.close()


async def test_snapshots_that_do_not_fit_both_databases_are_refused(store: Any) -> None:
    await call(store.append("c", Message.user("x")))
    good = json.loads((await call(store.save_state("c"))).to_json())
    for path, value in (
        (("messages", 0, "seq"), 2**63 - 1),
        (("messages", 0, "seq"), 2**62 + 1),
        (("messages", 0, "token_count"), 2**31),
        (("messages", 0, "token_counter"), "y" * 65),
        (("messages", 0, "created_at"), "0001-01-01T00:00:00+05:00"),
        (("conversation", "created_at"), "9999-12-31T23:59:59-05:00"),
        (("messages", 0, "content"), "\ud800"),
        (("conversation", "id"), "\ud800"),
    ):
        snapshot = json.loads(json.dumps(good))
        target: Any = snapshot
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        with pytest.raises(pydantic.ValidationError):
            await call(store.load_state(snapshot, "copy"))
        with pytest.raises(ConversationNotFoundError):
            await call(store.get_conversation("copy"))
    # The largest seq loads, and appending after it still works on both databases.
    snapshot = json.loads(json.dumps(good))
    snapshot["messages"][0]["seq"] = 2**62 - 1
    await call(store.load_state(snapshot, "copy"))
    appended = await call(store.append("copy", Message.user("y")))
    assert appended.seq == 2**62
    assert [m.seq for m in await call(store.messages("copy"))] == [2**62 - 1, 2**62]


async def test_list_conversations_after_refuses_unstorable_text(store: Any) -> None:
    await call(store.append("a", Message.user("x")))
    for after in ("a\x00", "\ud800"):
        with pytest.raises(InvalidInputError, match="after"):
            await call(store.list_conversations(after=after))
    assert [c.id for c in await call(store.list_conversations(after="\U0001f600"))] == []


def test_stored_message_timestamps_out_of_range_are_validation_errors() -> None:
    from datetime import timedelta

    with pytest.raises(pydantic.ValidationError, match="created_at"):
        StoredMessage(role="user", content="x", id="m", conversation_id="c", seq=1,
                      created_at=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
                      token_count=1, token_counter="fixed")


# ---- URLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "needle"), [
    ("agent.db", "sqlite:///agent.db"),
    ("nonsense", "not a database URL"),
    ("", "not a database URL"),
    ("mysql://u@localhost/db", "does not support the database 'mysql'"),
    ("mysql+pymysql://u@localhost/db", "does not support the database 'mysql'"),
    ("oracle://u@localhost/db", "does not support"),
    # UnicodeEncodeError from the driver, and a plain ValueError from the dialect, before
    ("sqlite:////tmp/\ud800.db", "lone surrogate at index 15"),
    ("postgresql://\udcff@127.0.0.1/postgres", "lone surrogate"),
    ("sqlite:///memstore-never-created.db?timeout=abc", "could not convert"),
    ("sqlite:///memstore-never-created.db?check_same_thread=maybe", "'maybe'"),
])
async def test_bad_urls_are_configuration_errors(url: str, needle: str) -> None:
    for factory in (MemoryStore, AsyncMemoryStore):
        with pytest.raises(ConfigurationError) as info:
            factory(url)
        assert needle in str(info.value)


async def test_unknown_engine_options_are_configuration_errors(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    for factory in (MemoryStore, AsyncMemoryStore):
        with pytest.raises(ConfigurationError, match="bogus_option"):
            factory(url, bogus_option=1)


def test_a_missing_driver_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    for url in ("postgresql://u@localhost/db", "postgres://u@localhost/db",
                "postgresql+psycopg2://u@localhost/db"):
        with pytest.raises(MissingDependencyError, match=r"memstore\[postgres\]"):
            MemoryStore(url)
        with pytest.raises(MissingDependencyError, match=r"memstore\[postgres\]"):
            AsyncMemoryStore(url)
    monkeypatch.setitem(sys.modules, "aiosqlite", None)
    with pytest.raises(MissingDependencyError, match=r"memstore\[async\]"):
        AsyncMemoryStore("sqlite://")


@pytest.mark.postgres
def test_postgres_scheme_is_postgresql(pg_url: str) -> None:
    url = pg_url.replace("postgresql+psycopg://", "postgres://", 1)
    assert url.startswith("postgres://")
    store = MemoryStore(url, counter=FixedCounter(per_message=1))
    try:
        assert store.engine.dialect.name == "postgresql"
        assert store.engine.url.drivername == "postgresql+psycopg"
    finally:
        store.close()


def test_cli_reports_bad_urls_without_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    for url in ("nonsense", "mysql://u@h/db", "agent.db"):
        assert main(["db", "current", "--url", url]) == 2  # bad usage (docs/cli.md)
        err = capsys.readouterr().err
        assert err.startswith("memstore: error:"), err
        assert "Traceback" not in err


def test_cli_refuses_undecodable_arguments_and_writes_nothing(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # On POSIX, argv bytes that are not UTF-8 arrive as surrogates (surrogateescape).
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert main(["append", "--url", url, "c", "user", "\udcff\udcfe"]) == 2
    assert "surrogate" in capsys.readouterr().err
    assert main(["append", "--url", url, "\udcff", "user", "hi"]) == 2  # bad usage
    assert "conversation id" in capsys.readouterr().err
    assert main(["conversations", "--url", url]) == 0
    assert capsys.readouterr().out.strip() == ""


async def test_load_state_into_an_empty_id_is_refused(store: Any) -> None:
    await call(store.append("c", Message.user("x")))
    state = await call(store.save_state("c"))
    await call(store.append("c", Message.user("y")))
    with pytest.raises(InvalidInputError, match="empty"):
        await call(store.load_state(state, ""))
    assert len(await call(store.messages("c"))) == 2  # not silently replaced


# ---- sizes: one bound under both databases' limits --------------------------------------------


def test_records_over_the_size_bound_are_refused_by_name() -> None:
    from memstore._validate import MAX_RECORD_BYTES

    over = MAX_RECORD_BYTES + 1
    with pytest.raises(pydantic.ValidationError, match="67,108,865 bytes in UTF-8"):
        Message.user("a" * over)
    # Bytes, not characters: 2-byte characters reach the bound at half the length.
    with pytest.raises(pydantic.ValidationError, match="bytes in UTF-8"):
        Message.user("é" * (MAX_RECORD_BYTES // 2 + 1))
    half = "a" * (MAX_RECORD_BYTES // 2)
    with pytest.raises(pydantic.ValidationError, match="the message"):  # content + metadata
        Message.user(half, metadata={"k": half})
    with pytest.raises(pydantic.ValidationError, match="the message"):  # two text parts
        Message.user([{"type": "text", "text": half}, {"type": "text", "text": half + "a"}])
    with pytest.raises(pydantic.ValidationError, match="the message"):  # a data URL image
        Message.user([{"type": "image_url", "image_url": {"url": "data:," + "a" * over}}])
    with pytest.raises(pydantic.ValidationError, match="the message"):  # tool arguments
        Message(role="assistant", tool_calls=[{"id": "c", "name": "f",
                                               "arguments": json.dumps({"a": half + half})}])


@pytest.mark.slow
async def test_records_at_the_size_bound_round_trip_on_both_databases(store: Any) -> None:
    from memstore._validate import MAX_RECORD_BYTES

    content = "a" * MAX_RECORD_BYTES
    stored = await call(store.append("c", Message.user(content)))
    assert (await call(store.get_message("c", stored.seq))).content == content
    del content
    blob = "b" * (MAX_RECORD_BYTES - len('{"blob":""}'))
    with pytest.raises(InvalidInputError, match="metadata is 67,108,865 bytes"):
        await call(store.create_conversation("d", {"blob": blob + "b"}))
    await call(store.create_conversation("d", {"blob": blob}))
    assert (await call(store.get_conversation("d"))).metadata == {"blob": blob}


async def test_a_summary_over_the_size_bound_is_refused_and_nothing_is_written(
    store: Any,
) -> None:
    from memstore._validate import MAX_RECORD_BYTES

    await call(store.extend("c", [Message.user(f"m{i}") for i in range(20)]))
    with pytest.raises(InvalidInputError, match="the summary is 67,108,865 bytes"):
        await call(store.summarize("c", lambda _: "s" * (MAX_RECORD_BYTES + 1), keep_tokens=10))
    assert await call(store.summaries("c")) == []


_JSON_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(10**60), max_value=10**60)
                 | st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15,
                             max_value=1e15).filter(lambda f: f != 0.0 or str(f) == "0.0")
                 | st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                                  blacklist_characters="\x00")))


@settings(max_examples=examples(300), deadline=None, derandomize=True)
@given(st.recursive(_JSON_SCALARS, lambda inner: st.lists(inner, max_size=5)
                    | st.dictionaries(st.text(max_size=8).filter(lambda k: "\x00" not in k
                                                                 and k.isprintable()),
                                      inner, max_size=5), max_leaves=30))
def test_the_cheap_json_size_bound_is_never_below_the_exact_size(value: Any) -> None:
    """Writes check sizes against the bound and serialise only when it might be over."""
    from memstore._validate import json_size, json_size_bound

    assert json_size_bound(value) >= json_size(value)
    assert json_size_bound({"k": value}) >= json_size({"k": value})


# ---- the top of the seq range, iteration bounds, timestamps every session can read ---------


async def test_a_full_conversation_refuses_every_write_that_allocates_and_writes_nothing(
    store: Any,
) -> None:
    await call(store.append("c", Message.user("x")))
    snapshot = json.loads((await call(store.save_state("c"))).to_json())
    snapshot["messages"][0]["seq"] = 2**62  # the largest seq: the conversation is full
    await call(store.load_state(snapshot, "full"))
    before = await call(store.get_conversation("full"))
    writes = (
        lambda: store.append("full", Message.user("y")),
        lambda: store.append("full", Message.user("y", id="client-1")),
        lambda: store.extend("full", [Message.user("y"), Message.assistant("z")]),
        lambda: store.load_state(snapshot, "full", replace=False),
        lambda: store.rewrite("full", lambda ms: [*ms, Message.user("y")], newest=1),
    )
    for write in writes:
        with pytest.raises(ConflictError, match="'full' is full"):
            await call(write())
    assert [m.seq for m in await call(store.messages("full"))] == [2**62]
    assert await call(store.get_conversation("full")) == before
    # Reads and the conversation's own message still work; replacing it frees the range.
    assert (await call(store.get_message("full", 2**62))).text == "x"
    snapshot["messages"][0]["seq"] = 1
    await call(store.load_state(snapshot, "full", replace=True))
    assert (await call(store.append("full", Message.user("y")))).seq == 2


async def test_iter_messages_bounds_past_the_seq_range_mean_all(store: Any) -> None:
    await call(store.extend("c", [Message.user(f"m{i}") for i in range(3)]))

    async def seqs(**bounds: Any) -> list[int]:
        it = store.iter_messages("c", page_size=2, **bounds)
        if hasattr(it, "__aiter__"):
            return [m.seq async for m in it]
        return [m.seq for m in it]

    assert await seqs(start=-(2**70), stop=2**70) == [1, 2, 3]
    assert await seqs(start=2**70) == []
    assert await seqs(stop=-(2**70)) == []
    with pytest.raises(InvalidInputError, match="start"):
        await seqs(start="1")


@pytest.mark.parametrize("moment", [
    "0001-01-01T12:00:00+00:00",  # within a day of the smallest datetime
    "0001-01-01T00:00:00+05:00",  # out of range once in UTC
    "9999-12-31T00:00:00+00:00",  # within a day of the largest
    "9999-12-31T23:59:59-05:00",
])
def test_timestamps_a_time_zone_could_not_represent_are_refused(moment: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="out of range"):
        StoredMessage.model_validate({
            "role": "user", "content": "x", "id": "m", "conversation_id": "c", "seq": 1,
            "created_at": moment, "token_count": 1, "token_counter": "fixed"})


@pytest.mark.postgres
def test_extreme_timestamps_read_back_in_any_postgres_session_time_zone(pg_url: str) -> None:
    """A session whose TimeZone is not UTC gets timestamps converted to it by the server;
    the accepted range leaves a day on each side so that no zone overflows."""
    writer = MemoryStore(pg_url)
    writer.load_state(ConversationState.model_validate({
        "conversation": {"id": "edges", "created_at": "0001-01-02T00:00:00+00:00",
                         "updated_at": "9999-12-30T23:59:59.999999+00:00"},
        "messages": [
            {"role": "user", "content": "x", "id": "early", "conversation_id": "edges",
             "seq": 1, "created_at": "0001-01-02T00:00:00+00:00", "token_count": 1,
             "token_counter": "fixed"},
            {"role": "user", "content": "y", "id": "late", "conversation_id": "edges",
             "seq": 2, "created_at": "9999-12-30T23:59:59.999999+00:00", "token_count": 1,
             "token_counter": "fixed"},
        ]}), replace=True)
    expected = writer.messages("edges")
    conversation = writer.get_conversation("edges")
    writer.close()
    for zone in ("America/New_York", "Asia/Tokyo", "Pacific/Kiritimati", "Etc/GMT+12"):
        reader = MemoryStore(pg_url, connect_args={"options": f"-c TimeZone={zone}"})
        assert reader.messages("edges") == expected, zone
        assert reader.get_conversation("edges") == conversation
        window = reader.window("edges", TokenLimitedView(1000))
        assert [m.created_at for m in window.messages] == [m.created_at for m in expected]
        reader.close()


@pytest.mark.postgres
@pytest.mark.parametrize("zone", ["Etc/UTC", "Europe/Berlin", None])
@pytest.mark.parametrize("injected", [False, True])
def test_every_postgres_read_hands_out_timezone_utc(
    pg_url: str, zone: str | None, injected: bool
) -> None:
    """Whatever the session's TimeZone (a server set to Etc/UTC, a client's own zone, or
    memstore's engine left to choose), windows, messages(), states and summaries carry
    ``timezone.utc``: the same message reads back identical on every path."""
    import secrets

    import sqlalchemy

    from memstore import Summary

    cid = f"tz-{zone}-{injected}-{secrets.token_hex(4)}"
    writer = MemoryStore(pg_url, counter=FixedCounter())
    writer.extend(cid, [Message(role="system", content="s"), Message(role="user", content="u"),
                         Message(role="assistant", content="a")])
    writer.summarize(cid, lambda messages: "sum", keep_tokens=0)
    writer.close()
    connect_args = {"options": f"-c TimeZone={zone}"} if zone else {}
    if injected:
        engine = sqlalchemy.create_engine(
            pg_url.replace("postgresql://", "postgresql+psycopg://", 1),
            connect_args=connect_args)
        reader = MemoryStore(engine=engine, counter=FixedCounter(), cache_size=0)
    else:
        reader = MemoryStore(pg_url, counter=FixedCounter(), cache_size=0,
                             connect_args=connect_args)
    reads = [
        *reader.messages(cid),
        *reader.window(cid, TokenLimitedView(1000)).messages,
        *reader.save_state(cid).messages,
    ]
    summaries: list[Summary] = reader.summaries(cid)
    reader.close()
    if injected:
        engine.dispose()
    assert len(reads) == 9 and len(summaries) == 1
    for item in [*reads, *summaries]:
        assert item.created_at.tzinfo is timezone.utc, (zone, injected, item)


@pytest.mark.postgres
def test_postgres_session_options_from_the_environment_are_honoured(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """memstore sends no ``options`` of its own: a deployment's PGOPTIONS (here a
    search_path) applies, so its tables are found where it keeps them."""
    import secrets

    import sqlalchemy

    schema = f"opts_{secrets.token_hex(4)}"
    admin = sqlalchemy.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with admin.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    try:
        monkeypatch.setenv("PGOPTIONS", f"-c search_path={schema} -c TimeZone=Asia/Tokyo")
        from memstore import migrate

        migrate.upgrade(pg_url)
        store = MemoryStore(pg_url, counter=FixedCounter())
        store.append("c", Message.user("hello"))
        window = store.window("c", TokenLimitedView(100))
        store.close()
        assert window.messages[0].created_at.tzinfo is timezone.utc
        with admin.connect() as conn:
            tables = conn.exec_driver_sql(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
                "AND table_name = 'memstore_messages'", (schema,)).all()
        assert tables == [("memstore_messages",)]
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        admin.dispose()


def _export(conversation: str, messages: list[dict[str, Any]]) -> str:
    header = {"memstore_export": 1, "type": "conversation", "id": conversation,
              "created_at": "2026-01-05T10:00:00Z", "updated_at": "2026-01-05T10:02:11Z",
              "metadata": {}, "message_count": len(messages)}
    return "".join(json.dumps(line) + "\n" for line in [header, *messages])


def _line(seq: int, mid: str, counter: str = "approx/4") -> dict[str, Any]:
    return {"role": "user", "content": "hello world", "id": mid, "seq": seq,
            "created_at": "2026-01-05T10:00:00Z", "token_count": 4, "token_counter": counter}


def test_a_counter_name_that_would_rebuild_too_long_is_recounted_by_the_store(
    db_url: str,
) -> None:
    """ "approx/1e300" is short, but the counter it names is called by a 300-digit name,
    which no token_counter column holds: the store's counter recounts the message."""
    import io

    from memstore import import_jsonl

    store = MemoryStore(db_url, counter=FixedCounter(3))
    result = import_jsonl(store, io.StringIO(_export("c", [_line(1, "a", "approx/1e300")])))
    assert result.conversations[0].recounted == 1
    [message] = store.messages("c")
    assert (message.token_counter, message.token_count) == (store.counter.name,
                                                            store.counter.count_message(message))
    store.close()


@pytest.mark.parametrize("batch", [1000, 2])  # the repeat in the same batch, or a later one
def test_an_import_repeating_a_message_id_is_refused_by_line_and_writes_nothing(
    db_url: str, batch: int, monkeypatch: Any,
) -> None:
    import io

    from memstore import import_jsonl, transfer
    from memstore.errors import ImportFormatError

    monkeypatch.setattr(transfer, "IMPORT_BATCH", batch)
    store = MemoryStore(db_url)
    text = _export("dup", [_line(1, "a"), _line(2, "b"), _line(3, "a"), _line(4, "c")])
    for replace in (False, True):
        with pytest.raises(ImportFormatError, match="unique within a conversation") as info:
            import_jsonl(store, io.StringIO(text), replace=replace)
        # The repeat's own line (seq 3 is the fourth), not its batch's last, whether the
        # id it repeats is in its batch or an earlier one (read back in a savepoint).
        assert info.value.line == 4
        assert "message id 'a' is the id of seq 1 and of seq 3" in str(info.value)
        with pytest.raises(ConversationNotFoundError):
            store.get_conversation("dup")
    store.close()


def test_a_snapshot_repeating_a_message_id_is_refused_by_validation() -> None:
    snapshot = {
        "conversation": {"id": "c", "created_at": "2026-01-05T10:00:00Z",
                         "updated_at": "2026-01-05T10:00:00Z"},
        "messages": [dict(_line(1, "a"), conversation_id="c"),
                     dict(_line(2, "a"), conversation_id="c")],
    }
    with pytest.raises(pydantic.ValidationError, match="'a' is the id of seq 1 and of seq 2"):
        ConversationState.model_validate(snapshot)


async def test_loading_ids_a_conversation_holds_already_names_the_conflict(store: Any) -> None:
    await call(store.extend("c", [Message.user("x", id="k"), Message.user("y")]))
    state = await call(store.save_state("c"))
    before = await call(store.messages("c"))
    with pytest.raises(ConflictError, match="already stored in conversation 'c'"):
        await call(store.load_state(state, "c", replace=False))
    assert await call(store.messages("c")) == before


def test_tool_call_arguments_may_be_a_mapping_stored_as_compact_json() -> None:
    from memstore import ToolCall

    call_ = ToolCall(id="c", name="f", arguments={"city": "Zürich", "days": [1, None]})
    assert call_.arguments == '{"city":"Zürich","days":[1,null]}'
    assert ToolCall.model_validate(
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    ).arguments == '{"a":1}'
    message = Message.assistant(tool_calls=[{"id": "c", "name": "f", "arguments": {"a": 1}}])
    assert message.to_openai()["tool_calls"][0]["function"]["arguments"] == '{"a":1}'
    for bad, says in [({"a": float("nan")}, "nan"), ({"a": {1, 2}}, "arguments"),
                      (5, "JSON text of the arguments"), (None, "JSON text")]:
        with pytest.raises(pydantic.ValidationError, match=says) as info:
            ToolCall(id="c", name="f", arguments=bad)
        assert len(info.value.errors()) == 1
