"""Messages read from a store are read-only all the way down.

The row cache shares decoded messages between windows: a caller changing a window
message's nested ``metadata``, ``content`` parts or ``tool_calls`` used to change what
every later window of the conversation returned (and broke its token budget).
"""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest

from memstore import (
    Message,
    ReadOnlyError,
    StoredMessage,
    TextPart,
    TokenLimitedView,
    ToolCall,
    UnboundedView,
)
from memstore._db.readonly import EMPTY, ReadOnlyDict, ReadOnlyList, freeze
from memstore.tokens import FixedCounter
from tests.helpers import call

META = {"tag": "original", "trace": {"step": 1, "path": [1, 2, {"deep": []}]}}


def _changes(message: StoredMessage) -> list[Any]:
    """Every way a caller could change a message's nested values in place."""
    meta, parts, calls = message.metadata, message.content, message.tool_calls
    out: list[Any] = [
        lambda: meta.__setitem__("tag", "changed"),
        lambda: meta.__delitem__("tag"),
        lambda: meta.update(tag="changed"),
        lambda: meta.setdefault("new", 1),
        lambda: meta.pop("tag"),
        lambda: meta.popitem(),
        lambda: meta.clear(),
        lambda: meta["trace"].__setitem__("step", 99),
        lambda: meta["trace"]["path"].append(3),
        lambda: meta["trace"]["path"][2]["deep"].append(1),
    ]
    for items in (parts, calls):
        if isinstance(items, list):
            out += [
                lambda items=items: items.append(items[0]),
                lambda items=items: items.extend([items[0]]),
                lambda items=items: items.insert(0, items[0]),
                lambda items=items: items.__setitem__(0, items[0]),
                lambda items=items: items.__delitem__(0),
                lambda items=items: items.pop(),
                lambda items=items: items.remove(items[0]),
                lambda items=items: items.clear(),
                lambda items=items: items.reverse(),
                lambda items=items: items.sort(key=id),
            ]
    return out


def _messages() -> list[Message]:
    call_ = ToolCall(id="call-1", name="lookup", arguments='{"q": "x"}')
    return [
        Message.user("first", metadata=META),
        Message.user([TextPart(text="a"), TextPart(text="b")], metadata=META),
        Message.assistant(None, tool_calls=[call_], metadata=META),
        Message.tool("result", tool_call_id="call-1", metadata=META),
    ]


async def test_changing_a_window_message_is_refused_and_later_windows_are_intact(
    store: Any,
) -> None:
    stored = await call(store.extend("c", _messages()))
    view = TokenLimitedView(10_000)
    first = await call(store.window("c", view))  # decoded now, kept in the row cache
    for message in first.messages:
        for change in _changes(message):
            with pytest.raises(ReadOnlyError, match="read-only"):
                change()
            with pytest.raises(TypeError):  # also a TypeError, like a tuple's
                change()
    again = await call(store.window("c", view))  # served from the row cache
    assert again.messages == first.messages == await call(store.messages("c")) == stored
    assert again.messages[0].metadata == META
    assert again.token_count == first.token_count


async def test_every_read_and_append_returns_read_only_values_decoupled_from_the_caller(
    store: Any,
) -> None:
    metadata = json.loads(json.dumps(META))
    appended = await call(store.append("c", Message.user("x", metadata=metadata)))
    metadata["tag"] = "changed by the caller after the append"
    assert appended.metadata == META  # a read-only copy, not the caller's dict
    await call(store.extend("c", _messages()[1:]))
    reads = [
        appended,
        await call(store.get_message("c", 2)),
        *(await call(store.messages("c"))),
        *(await call(store.window("c", UnboundedView()))).messages,
        *(await call(store.save_state("c"))).messages,
    ]
    for message in reads:
        assert type(message.metadata) is ReadOnlyDict
        for items in (message.content, message.tool_calls):
            assert items is None or isinstance(items, str) or type(items) is ReadOnlyList
        for change in _changes(message):
            with pytest.raises(ReadOnlyError):
                change()


async def test_a_read_message_copies_into_plain_containers_and_writes_back(store: Any) -> None:
    await call(store.extend("c", _messages()))
    message = (await call(store.messages("c")))[2]  # the tool call
    deep = message.model_copy(deep=True)
    deep.metadata["tag"] = "mine"
    deep.metadata["trace"]["path"].append(3)
    assert deep.tool_calls is not None
    deep.tool_calls.append(deep.tool_calls[0])
    assert message.metadata == META and len(message.tool_calls or ()) == 1
    for plain in (copy.copy(message.metadata), copy.deepcopy(message.metadata),
                  dict(message.metadata)):
        assert type(plain) is dict and plain == META
        plain["tag"] = "mine"
    assert type(copy.copy(message.tool_calls)) is list
    assert type(list(message.tool_calls or ())) is list
    # The read message serialises, validates and is written again as any other.
    assert json.loads(message.model_dump_json())["metadata"] == META
    assert StoredMessage.model_validate(message.model_dump()) == message
    assert pickle.loads(pickle.dumps(message)) == message
    copied = await call(store.append("d", Message.model_validate(
        message.model_dump(include=set(Message.model_fields)) | {"id": None})))
    assert copied.metadata == META and copied.tool_calls == message.tool_calls


def test_freeze_reaches_every_nested_value_and_shares_the_empty_dict() -> None:
    value = {"a": [1, {"b": [{}], "c": "s"}], "d": None, "e": {}}
    frozen = freeze(value)
    assert frozen == value and frozen is not value
    assert type(frozen) is ReadOnlyDict and type(frozen["a"]) is ReadOnlyList
    assert type(frozen["a"][1]) is ReadOnlyDict and frozen["a"][1]["b"][0] is EMPTY
    assert frozen["e"] is EMPTY and freeze({}) is EMPTY
    assert freeze(frozen) is frozen  # frozen already: not copied again
    for plain in (copy.deepcopy(frozen), pickle.loads(pickle.dumps(frozen))):
        assert plain == value
    assert type(copy.deepcopy(frozen)["a"]) is list
    with pytest.raises(ReadOnlyError):
        frozen |= {"x": 1}
    items = frozen["a"]
    with pytest.raises(ReadOnlyError):
        items += [1]
    with pytest.raises(ReadOnlyError):
        items *= 2
    assert value == {"a": [1, {"b": [{}], "c": "s"}], "d": None, "e": {}}


def test_a_view_over_a_list_of_caller_built_messages_leaves_them_changeable() -> None:
    """Only messages read from a store are read-only: ones a caller builds stay plain."""
    from memstore.models import StoredMessage as SM
    from memstore.views.history import ListHistory

    message = SM.model_validate({
        "role": "user", "content": "x", "metadata": {"k": [1]}, "id": "m",
        "conversation_id": "c", "seq": 1, "created_at": "2026-01-01T00:00:00Z",
        "token_count": 1, "token_counter": "fixed/1"})
    window = UnboundedView().select(ListHistory([message]), FixedCounter(1))
    window.messages[0].metadata["k"].append(2)
    assert message.metadata == {"k": [1, 2]}
