"""Invalid input raises an error naming the problem, and writes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import pydantic
import pytest

from memstore.errors import InvalidInputError
from memstore.models import ImagePart, ImageURL, Message, ToolCall
from tests.helpers import Cases, call

LONG = "x" * 256


def _bad_messages() -> list[tuple[str, Any, str]]:
    """(case id, message as the caller passes it, text the error must contain)."""
    return [
        ("unknown-role", {"role": "robot", "content": "hi"}, "role"),
        ("tool-without-call-id", {"role": "tool", "content": "42"}, "tool_call_id is required"),
        ("tool-calls-on-user", {"role": "user", "content": "x", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
         "only allowed on assistant"),
        ("call-id-on-assistant", {"role": "assistant", "content": "x", "tool_call_id": "c1"},
         "tool_call_id is only allowed on tool messages"),
        ("duplicate-tool-call-ids", {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c1", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
         "duplicate ids: c1"),
        ("negative-score", {"role": "user", "content": "x", "score": -0.5}, "score"),
        ("nan-score", {"role": "user", "content": "x", "score": float("nan")}, "score"),
        ("inf-score", {"role": "user", "content": "x", "score": float("inf")}, "score"),
        # stored as 1.0 while set_score refused True
        ("bool-score", {"role": "user", "content": "x", "score": True}, "not the bool True"),
        ("nul-in-content", {"role": "user", "content": "bad\x00byte"}, "NUL"),
        ("nul-in-name", {"role": "user", "content": "x", "name": "a\x00b"}, "NUL"),
        ("set-in-metadata", {"role": "user", "content": "x", "metadata": {"tags": {1, 2}}},
         "metadata"),
        ("datetime-in-metadata", {"role": "user", "content": "x",
                                  "metadata": {"when": datetime(2026, 1, 1)}}, "metadata"),
        ("nan-in-metadata", {"role": "user", "content": "x", "metadata": {"v": float("nan")}},
         "not valid JSON"),
        ("non-string-metadata-key", {"role": "user", "content": "x", "metadata": {1: "a"}},
         "metadata"),
        ("metadata-not-object", {"role": "user", "content": "x", "metadata": [1, 2]},
         "metadata"),
        ("missing-user-content", {"role": "user", "content": None}, "content is required"),
        ("empty-tool-name", {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "", "arguments": "{}"}}]},
         "tool call name"),
        ("message-id-too-long", {"role": "user", "content": "x", "id": LONG}, "255"),
        ("empty-message-id", {"role": "user", "content": "x", "id": ""}, "must not be empty"),
        ("image-in-system", {"role": "system", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}, "only hold text"),
        ("unknown-openai-key", {"role": "user", "content": "x", "colour": "red"}, "colour"),
        ("not-a-message", "just a string", "OpenAI message dict"),
        ("nul-in-tool-arguments", {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\x00}"}}]},
         "NUL"),
    ]


@asynccontextmanager
async def _writes_nothing(store: Any, cid: str) -> AsyncIterator[None]:
    """Seed ``cid`` with one message; the block's refused writes must leave the store as
    it was: the conversation's messages, its row, and the list of conversations."""
    await call(store.append(cid, Message.user("existing")))
    before = await call(store.messages(cid))
    conv_before = await call(store.get_conversation(cid))
    ids_before = [c.id for c in await call(store.list_conversations())]
    yield
    assert await call(store.messages(cid)) == before
    assert await call(store.get_conversation(cid)) == conv_before
    assert [c.id for c in await call(store.list_conversations())] == ids_before


async def test_invalid_message_is_rejected_and_nothing_written(store: Any) -> None:
    """Each of _bad_messages() is refused naming the problem, and writes nothing.

    The cases share one store, each on its own conversations (``c<i>`` holding one message,
    and ``brand-new-<i>``, which must not come to exist) and judged against what the store
    held just before it; a failure names every failing case."""
    cases = Cases()
    for i, (case, bad, needle) in enumerate(_bad_messages()):
        with cases.case(case):
            cid = f"c{i}"
            async with _writes_nothing(store, cid):
                with pytest.raises((pydantic.ValidationError, InvalidInputError)) as info:
                    await call(store.append(cid, bad))
                assert needle in str(info.value), f"{case}: {info.value}"
                with pytest.raises((pydantic.ValidationError, InvalidInputError)):
                    await call(store.extend(cid, [Message.user("fine"), bad]))
                with pytest.raises((pydantic.ValidationError, InvalidInputError)):
                    await call(store.append(f"brand-new-{i}", bad))
    cases.check()


async def test_invalid_conversation_id(store: Any) -> None:
    """Each bad id is refused naming the problem (one store for all: a refused write
    writes nothing, checked after each case); a failure names every failing case."""
    cases = Cases()
    for cid, needle in [
        ("", "must not be empty"),
        (LONG, "256 characters long; the maximum is 255"),
        ("a\x00b", "NUL"),
        (42, "must be a str"),
    ]:
        with cases.case(cid):
            with pytest.raises(InvalidInputError, match=needle):
                await call(store.append(cid, Message.user("x")))
            with pytest.raises(InvalidInputError, match=needle):
                await call(store.create_conversation(cid))
            assert await call(store.list_conversations()) == []
    cases.check()


async def test_invalid_arguments(store: Any) -> None:
    await call(store.append("c", Message.user("x")))
    cases: list[tuple[Any, str]] = [
        (lambda: store.get_message("c", 0), "seq must be an int >= 1"),
        (lambda: store.get_message("c", "1"), "seq must be an int >= 1"),
        (lambda: store.pop("c", -1), "n must be an int >= 0"),
        (lambda: store.truncate("c", before_seq=0), "before_seq"),
        (lambda: store.list_conversations(limit=0), "limit"),
        (lambda: store.create_conversation("d", metadata={"x": {1, 2}}), "metadata"),
        (lambda: store.create_conversation("d", metadata="nope"), "metadata must be a JSON object"),
        (lambda: store.extend("c", Message.user("single")), "list of messages"),
        (lambda: store.window("c", object()), "not a context view"),
        (lambda: store.load_state(42), "state must be"),
    ]
    for make, needle in cases:
        with pytest.raises(InvalidInputError, match=needle):
            await call(make())
    assert len(await call(store.messages("c"))) == 1


def test_model_level_validation_names_fields() -> None:
    with pytest.raises(pydantic.ValidationError, match="tool_call_id"):
        Message.tool("x", tool_call_id="")
    with pytest.raises(pydantic.ValidationError, match="arguments"):
        ToolCall(id="a", name="f", arguments=None)  # type: ignore[arg-type]
    with pytest.raises(pydantic.ValidationError, match="detail"):
        ImagePart(image_url=ImageURL(url="u", detail="ultra"))  # type: ignore[arg-type]
    # empty tool_calls is normalised to None, not an error
    assert Message.assistant("x", tool_calls=[]).tool_calls is None


def _unvalidated_messages() -> list[tuple[str, Any, str]]:
    """(case id, a Message that never went through validation as it is, error text)."""
    user = Message.user("fine", metadata={"a": 1})
    mutated = Message.user("fine", metadata={"a": 1})
    mutated.metadata["a"] = float("inf")  # the frozen model's nested dict, changed in place
    return [
        ("copy-nul-content", user.model_copy(update={"content": "a\x00b"}), "NUL"),
        ("copy-surrogate", user.model_copy(update={"content": "\ud800"}), "surrogate"),
        ("copy-nan-score", user.model_copy(update={"score": float("nan")}), "score"),
        ("copy-call-id-on-user", user.model_copy(update={"tool_call_id": "c1"}),
         "tool_call_id is only allowed"),
        ("copy-bad-role", user.model_copy(update={"role": "robot"}), "role"),
        ("copy-nan-metadata", user.model_copy(update={"metadata": {"v": float("nan")}}),
         "not valid JSON"),
        ("constructed", Message.model_construct(role="user", content="a\x00b"), "NUL"),
        ("mutated-metadata", mutated, "inf"),
    ]


async def test_a_message_that_skipped_validation_is_validated_when_written(
    store: Any
) -> None:
    """pydantic's model_copy(update=...) and model_construct do not validate, and a
    message's metadata dict can be changed in place: a write validates such a message
    again, so the databases never see what validation refuses (SQLite stored NaN and
    NUL; PostgreSQL raised a driver error).

    The cases of _unvalidated_messages() share one store, each on its own conversation
    ``c<i>`` and judged against what the store held just before it; a failure names
    every failing case."""
    cases = Cases()
    for i, (case, bad, needle) in enumerate(_unvalidated_messages()):
        with cases.case(case):
            cid = f"c{i}"
            async with _writes_nothing(store, cid):
                with pytest.raises(pydantic.ValidationError) as info:
                    await call(store.append(cid, bad))
                assert needle in str(info.value), f"{case}: {info.value}"
                with pytest.raises(pydantic.ValidationError):
                    await call(store.extend(cid, [Message.user("ok"), bad]))
            # A valid copy is written as the copy says.
            good = Message.user("fine").model_copy(update={"content": "changed", "score": 2.0})
            stored = await call(store.append(cid, good))
            assert (stored.content, stored.score) == ("changed", 2.0)
    cases.check()


async def test_a_state_that_skipped_validation_is_validated_when_loaded(store: Any) -> None:
    """A ConversationState edited with model_copy(update=...), or holding messages that
    were, reached the databases unchecked: SQLite stored infinite metadata and a tool
    message without its call id, PostgreSQL raised driver errors, a lone surrogate
    raised UnicodeEncodeError. Loading validates the instance again; nothing is written."""
    from memstore.models import ConversationState

    await call(store.extend("c", [Message.user("a"), Message.assistant("b")]))
    state = await call(store.save_state("c"))
    first, second = state.messages
    edits = {
        "infinite metadata": [first.model_copy(update={"metadata": {"a": float("inf")}}), second],
        "surrogate": [first.model_copy(update={"content": "\ud800"}), second],
        "tool without call id": [first.model_copy(update={"role": "tool"}), second],
        "seq past the range": [first.model_copy(update={"seq": 2**63}),
                               second.model_copy(update={"seq": 2**63 + 1})],
        "repeated seq": [first, first],
    }
    for case, messages in edits.items():
        bad = state.model_copy(update={"messages": messages})
        with pytest.raises(pydantic.ValidationError):
            await call(store.load_state(bad, "t"))
        assert [c.id for c in await call(store.list_conversations())] == ["c"], case
    constructed = ConversationState.model_construct(
        conversation=state.conversation, summaries=[], view=None, version=2,
        format="memstore.conversation",
        messages=[first.model_copy(update={"role": "robot"}), second])
    with pytest.raises(pydantic.ValidationError):
        await call(store.load_state(constructed, "t"))
    # A valid edit loads as it says.
    renamed = state.model_copy(update={"messages": [first.model_copy(update={"content": "A"}),
                                                     second]})
    await call(store.load_state(renamed, "t"))
    assert [m.content for m in await call(store.messages("t"))] == ["A", "b"]


async def test_a_custom_view_returning_no_window_is_named(store: Any) -> None:
    """A ContextView subclass whose select returns something else (its messages, None)
    gave a raw AttributeError somewhere later; the view is named."""
    from dataclasses import dataclass

    from memstore.errors import ConfigurationError
    from memstore.views import ContextView, UnboundedView

    @dataclass(frozen=True)
    class ListView(ContextView):
        def select(self, source: Any, counter: Any) -> Any:
            return list(UnboundedView().select(source, counter).messages)

    await call(store.append("c", Message.user("hi")))
    with pytest.raises(ConfigurationError, match=r"ListView\.select returned list"):
        await call(store.window("c", ListView()))
    stored = await call(store.messages("c"))
    with pytest.raises(ConfigurationError, match=r"ListView\.select returned list"):
        ListView().apply(stored, store.counter)


async def test_idempotent_append_compares_metadata_as_json(store: Any) -> None:
    """1, 1.0 and True are equal in Python but three JSON values: a re-sent id whose
    metadata differs only so is a conflict, not the stored message."""
    from memstore.errors import ConflictError

    first = await call(store.append("c", Message.user("hi", id="m1",
                                                      metadata={"n": 1, "f": True})))
    again = await call(store.append("c", Message.user("hi", id="m1",
                                                      metadata={"f": True, "n": 1})))
    assert again == first  # key order does not matter
    for other in ({"n": 1.0, "f": True}, {"n": 1, "f": 1}, {"n": True, "f": True}):
        with pytest.raises(ConflictError, match="m1"):
            await call(store.append("c", Message.user("hi", id="m1", metadata=other)))
    assert len(await call(store.messages("c"))) == 1


async def test_a_closed_store_refuses_every_call(store: Any) -> None:
    """After close() a call quietly opened a new pool that nothing closed again: it is
    refused now, reads and writes alike; closing twice is fine."""
    import io

    from memstore import StoreClosedError, UnboundedView

    await call(store.append("c", Message.user("hi")))
    await call(store.close())
    calls: list[Any] = [
        lambda: store.append("c", Message.user("after")),
        lambda: store.extend("c", [Message.user("after")]),
        lambda: store.window("c", UnboundedView()),
        lambda: store.messages("c"),
        lambda: store.get_conversation("c"),
        lambda: store.list_conversations(),
        lambda: store.save_state("c"),
        lambda: store.dump_state("c", io.StringIO()),
        lambda: store.rewrite("c", lambda ms: ms),
        lambda: store.summarize("c", lambda ms: "s", keep_tokens=0),
        lambda: store.stats(),
    ]
    for make in calls:
        with pytest.raises(StoreClosedError, match="this store was closed"):
            await call(make())
    stream = store.iter_messages("c")
    with pytest.raises(StoreClosedError):
        await (stream.__anext__() if hasattr(stream, "__anext__") else call(next(stream)))
    await call(store.close())  # again: nothing to do


class _Unshowable:
    """A value whose ``repr`` raises, as a class with a broken ``__repr__`` does."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def _unshowable_cases() -> list[tuple[str, Any]]:
    """(case id, a call given the bad value ``v``) for arguments named in error messages."""
    from memstore import (
        ApproxCounter,
        FixedCounter,
        MemoryStore,
        TokenLimitedView,
        counter_from_name,
    )
    from memstore.context.builder import Block, ContextBuilder, HistoryBlock, Tier
    from memstore.context.formatters import MarkdownListFormatter, XMLFormatter, inject_into_system
    from memstore.context.strategies import Drop, Summarize, TruncateOldest
    from memstore.tokens import TiktokenCounter

    system = Message.system("rules")
    return [
        ("view-counter", lambda s, v: TokenLimitedView(100, counter=v)),
        ("durability", lambda s, v: MemoryStore("sqlite://", durability=v)),
        ("summarizer", lambda s, v: s.summarize("c", v, keep_tokens=0)),
        ("page-size", lambda s, v: list(s.iter_messages("c", page_size=v))),
        ("approx-counter", lambda s, v: ApproxCounter(v)),
        ("fixed-counter", lambda s, v: FixedCounter(per_message=v)),
        ("counter-name", lambda s, v: counter_from_name(v)),
        ("truncate-atomic", lambda s, v: TruncateOldest(keep_turns_atomic=v)),
        ("truncate-min", lambda s, v: TruncateOldest(min_messages=v)),
        ("truncate-roles", lambda s, v: TruncateOldest(protect_roles=[v])),
        ("summarize-strategy", lambda s, v: Summarize(summarizer=v)),
        ("markdown-heading", lambda s, v: MarkdownListFormatter(heading=v)),
        ("xml-tag", lambda s, v: XMLFormatter(tag=v)),
        ("inject-formatter", lambda s, v: inject_into_system(system, v, ["a"])),
        ("anthropic-role", lambda s, v: Message.from_anthropic({"role": v, "content": "x"})),
        ("anthropic-block-type", lambda s, v: Message.from_anthropic(
            {"role": "user", "content": [{"type": v}]})),
        ("tiktoken-threads", lambda s, v: TiktokenCounter(threads=v)),
        ("tiktoken-model", lambda s, v: TiktokenCounter(model=v)),
        ("tiktoken-encoding", lambda s, v: TiktokenCounter(encoding=v)),
        ("builder-max-tokens", lambda s, v: ContextBuilder(v)),
        ("builder-block", lambda s, v: ContextBuilder(10).add_block(v)),
        ("block-id", lambda s, v: Block(v, tier=Tier.HISTORY, strategy=Drop(), messages=[])),
        ("block-tier", lambda s, v: Block("b", tier=v, strategy=Drop(), messages=[])),
        ("history-store", lambda s, v: HistoryBlock(v, "c")),
    ]


@pytest.mark.parametrize("value", [10**5000, -(10**5000), _Unshowable()],
                         ids=["huge-int", "huge-negative-int", "raising-repr"])
def test_a_value_repr_cannot_show_is_named_in_a_clear_error(value: Any) -> None:
    """Error messages showed the bad value with ``repr``, which refuses integers of more
    than 4,300 digits (ValueError) and runs a class's own ``__repr__``: the caller got
    that exception instead of memstore's. ``ApproxCounter`` also raised OverflowError
    for an int past float's range, and ``FixedCounter`` a plain ValueError.

    Every call of _unshowable_cases() is tried on one store (each is refused before it
    writes; the store's messages are checked after each); a failure names every failing
    case."""
    from memstore import MemoryStore
    from memstore.errors import MemstoreError

    store = MemoryStore("sqlite://")
    store.append("c", Message.user("hi"))
    cases = Cases()
    try:
        for case, make in _unshowable_cases():
            with cases.case(case):
                before = [m.content for m in store.messages("c")]
                valid_when_positive = ("truncate-min", "tiktoken-threads")
                if isinstance(value, int) and (case == "block-tier"
                                               or (case in valid_when_positive and value > 0)):
                    make(store, value)  # a huge minimum is a valid (if odd) setting
                    continue
                with pytest.raises(MemstoreError) as caught:
                    make(store, value)
                message = str(caught.value)
                assert "cannot be shown" in message or "an integer of" in message, message
                assert len(message) < 600, message
                assert [m.content for m in store.messages("c")] == before
        with cases.case("after every case: the store holds 'hi' only"):
            assert [m.content for m in store.messages("c")] == ["hi"]
    finally:
        store.close()
    cases.check()


async def test_yes_no_arguments_take_only_bools(store: Any) -> None:
    """``bool(value)`` took ``replace="no"`` as yes: the stored conversation was replaced.
    Every yes/no argument of the store now takes True or False only."""
    import io

    from memstore.errors import InvalidInputError

    await call(store.append("c", Message.user("kept")))
    state = await call(store.save_state("c"))
    await call(store.append("c", Message.user("newer")))
    for bad in ("no", 0, None, [], 10**5000):
        with pytest.raises(InvalidInputError, match="replace must be True or False"):
            await call(store.load_state(state, "c", replace=bad))
        with pytest.raises(InvalidInputError, match="replace must be True or False"):
            await call(store.restore_state(io.StringIO(state.to_json()), "c", replace=bad))
        with pytest.raises(InvalidInputError, match="newest_first must be True or False"):
            await call(store.messages("c", newest_first=bad))
    assert [m.content for m in await call(store.messages("c"))] == ["kept", "newer"]


def test_yes_no_arguments_of_the_builder_and_migrations_take_only_bools(tmp_path: Any) -> None:
    from memstore import migrate
    from memstore.context.builder import Block, ContextBuilder, Tier
    from memstore.context.strategies import Drop
    from memstore.errors import InvalidInputError

    compiled = ContextBuilder(100).add_block(
        Block("b", tier=Tier.HISTORY, strategy=Drop(), messages=[Message.user("hi")])
    ).compile()
    with pytest.raises(InvalidInputError, match="cache_control must be True or False"):
        compiled.to_openai(cache_control="no")
    url = f"sqlite:///{tmp_path / 'm.db'}"
    for run in (lambda: migrate.upgrade(url, sql="no"),
                lambda: migrate.downgrade(url, "base", sql=1),
                lambda: migrate.validate_revision("head", "upgrade", sql="yes")):
        with pytest.raises(InvalidInputError, match="sql must be True or False"):
            run()
    assert not (tmp_path / "m.db").exists()


def test_export_and_import_check_their_arguments_before_writing(db_url: str) -> None:
    """``progress=5`` raised TypeError after the first page was written (a half-written
    file); ``conversation_ids=5`` a raw TypeError; ``replace="no"`` replaced."""
    import io

    from memstore import MemoryStore, transfer
    from memstore.errors import InvalidInputError

    store = MemoryStore(db_url)
    store.append("c", Message.user("hi"))
    out = io.StringIO()
    with pytest.raises(InvalidInputError, match="progress must be a callable"):
        transfer.export_jsonl(store, out, progress=5)
    with pytest.raises(InvalidInputError, match="conversation_ids must be a list of ids"):
        transfer.export_jsonl(store, out, 5)  # type: ignore[arg-type]
    assert out.getvalue() == ""
    transfer.export_jsonl(store, out)
    for kwargs in ({"progress": 5}, {"replace": "no"}):
        with pytest.raises(InvalidInputError, match=r"(progress|replace) must be"):
            transfer.import_jsonl(store, io.StringIO(out.getvalue()), **kwargs)
    assert [m.content for m in store.messages("c")] == ["hi"]
    store.close()


@pytest.mark.parametrize("bad", [None, 5, "text", {"role": "user", "content": "x"},
                                 [Message.user("a"), {"role": "user", "content": "x"}],
                                 Message.user("one")])
def test_renderers_name_what_is_not_a_list_of_messages(bad: Any) -> None:
    from memstore.errors import InvalidInputError
    from memstore.formats import to_anthropic, to_responses

    for render in (to_anthropic, to_responses):
        with pytest.raises(InvalidInputError, match="Message"):
            render(bad)


async def test_a_chat_context_made_directly_checks_its_arguments(store: Any) -> None:
    """``ChatContext(5, "c", view)`` was accepted and failed later with AttributeError;
    a bad id or view made directly (not through ``store.context``) went unchecked."""
    from memstore import AsyncChatContext, ChatContext, TokenLimitedView
    from memstore.errors import InvalidInputError

    cls = AsyncChatContext if type(store).__name__ == "AsyncMemoryStore" else ChatContext
    view = TokenLimitedView(100)
    for args, needle in (((5, "c", view), "needs a"), ((store, "", view), "conversation id"),
                         ((store, "c", "view"), "context view")):
        with pytest.raises(InvalidInputError, match=needle):
            cls(*args)
    context = cls(store, "c", view)
    await call(context.add_message(Message.user("hi")))
    assert [m.content for m in await call(context.get_messages())] == ["hi"]


def test_a_placeholder_count_is_checked() -> None:
    """``placeholder(10**5000)`` raised ValueError from str(), a template's float
    format raised OverflowError past float's range, and None or -1 made
    "Skipped None messages."."""
    from memstore import HeadAndTailView
    from memstore.errors import InvalidInputError

    view = HeadAndTailView(head_size=1, tail_size=1, placeholder_template="{n:,.3e} gone")
    for bad in (10**5000, 2**62 + 1, -1, None, "3", True, 2.0):
        with pytest.raises(InvalidInputError, match="skipped must be a count"):
            view.placeholder(bad)
    assert view.placeholder(2**62).content == "4.612e+18 gone"


async def test_a_rewrite_returning_an_unfilled_model_is_named(store: Any) -> None:
    """``Message.model_construct()`` (no fields set) made rewrite raise AttributeError
    while reading its fields for validation; the missing field is named now."""
    await call(store.append("c", Message.user("kept")))
    with pytest.raises(pydantic.ValidationError, match="role"):
        await call(store.rewrite("c", lambda messages: [Message.model_construct()]))
    assert [m.content for m in await call(store.messages("c"))] == ["kept"]


def test_with_hints_checks_its_arguments() -> None:
    """``is_error="yes"`` was stored as a non-bool hint; an int ``metadata`` or
    ``cache_control`` raised TypeError from ``dict()``."""
    from memstore.errors import InvalidInputError
    from memstore.formats import with_hints

    for kwargs, needle in (({"is_error": "yes"}, "is_error must be True or False"),
                           ({"cache_control": 5}, "cache_control must be a mapping"),
                           ({"metadata": 5}, "metadata must be a mapping")):
        with pytest.raises(InvalidInputError, match=needle):
            with_hints(**kwargs)
    assert with_hints({"a": 1}, is_error=False) == {"a": 1, "memstore": {"is_error": False}}
