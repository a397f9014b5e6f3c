"""What every framework adapter shares: store handling and the turn in progress.

Public API only (no SQL, no private store internals).

The turn in progress: frameworks read their history *before* they append what they
are about to add. When the newest stored message is an assistant message whose tool
calls are not all answered yet, the framework is about to add the results; every
view rightly leaves such an incomplete unit out of a window sent on its own, so the
adapters give the framework ``window + pending turn``: the window, then that call
and the results it already has. A call that is not the newest stored unit (the
conversation moved on without answering it) is never given back. The turn in
progress comes on top of a budgeted view's window. The window and the newest
messages are two reads; a write landing between them leaves the result valid
(whole units, then at most the newest pending call), if one message behind.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, TypeVar, cast

from pydantic import ValidationError

from memstore.aio import AsyncMemoryStore
from memstore.errors import ConfigurationError, ConversationNotFoundError, InvalidInputError
from memstore.models import Message, StoredMessage
from memstore.store import MemoryStore
from memstore.views import ContextView, UnboundedView

__all__ = [
    "AnyStore",
    "check_store",
    "check_view",
    "pending_turn",
    "read_history",
    "read_history_sync",
    "run",
    "store_url",
    "valid_name",
]

AnyStore = MemoryStore | AsyncMemoryStore
T = TypeVar("T")

#: First page of newest messages read to find the turn in progress.
_TAIL_PAGE = 16


def check_store(store: Any, owner: str) -> AnyStore:
    """Return ``store`` if it is a memstore store, else raise a ConfigurationError."""
    if not isinstance(store, (MemoryStore, AsyncMemoryStore)):
        raise ConfigurationError(
            f"{owner} needs a memstore MemoryStore or AsyncMemoryStore, "
            f"not {type(store).__name__}"
        )
    return store


def check_view(view: Any, owner: str) -> ContextView:
    """Return ``view`` (default: UnboundedView) if it is a memstore view."""
    if view is None:
        return UnboundedView()
    if not isinstance(view, ContextView):
        raise ConfigurationError(
            f"{owner}: view must be a memstore view, not {type(view).__name__}"
        )
    return view


def check_conversation(store: AnyStore, conversation_id: Any, view: ContextView,
                       argument: str) -> str:
    """``conversation_id`` if memstore can store it (the store's own rule, no I/O).

    ``argument`` names it in the error (``session_id`` for LangChain and the Agents SDK).
    """
    try:
        return store.context(conversation_id, view).conversation_id
    except InvalidInputError as exc:
        raise InvalidInputError(f"{argument}: {exc}") from None


def valid_name(value: str) -> bool:
    """Whether ``value`` can be a memstore message ``name`` (asks the model itself)."""
    try:
        Message(role="user", content="", name=value)
    except ValidationError:
        return False
    return True


def store_url(store: AnyStore) -> str:
    """The store's database URL, password included (for component configs)."""
    return store.engine.url.render_as_string(hide_password=False)


def pending_turn(newest_first: Sequence[StoredMessage],
                 exhausted: bool) -> list[StoredMessage] | None:
    """Find the turn in progress in the newest messages of a conversation.

    Args:
        newest_first: the newest stored messages, newest first.
        exhausted: whether ``newest_first`` reaches back to the conversation's start.

    Returns:
        ``[call, *results so far]`` (chronological) when the newest unit is an
        assistant tool call that is not fully answered; ``[]`` when there is none;
        ``None`` when more messages are needed to decide.
    """
    i = 0
    while i < len(newest_first) and newest_first[i].role == "tool":
        i += 1
    if i == len(newest_first):
        return [] if exhausted else None
    head = newest_first[i]
    if head.role != "assistant" or not head.tool_calls:
        return []
    ids = set(head.tool_call_ids)
    answered: set[str] = set()
    results: list[StoredMessage] = []
    for message in reversed(newest_first[:i]):
        call_id = message.tool_call_id
        if call_id in ids and call_id not in answered:
            answered.add(call_id)
            results.append(message)
    if answered == ids:
        return []
    return [head, *results]


def _assemble(window: Sequence[StoredMessage | Message],
              tail: Sequence[StoredMessage]) -> list[StoredMessage | Message]:
    if not tail:
        return list(window)
    first = tail[0].seq
    kept = [m for m in window if not (isinstance(m, StoredMessage) and m.seq >= first)]
    return [*kept, *tail]


def _history_steps(
    window: Sequence[StoredMessage | Message],
) -> Generator[int, Sequence[StoredMessage], list[StoredMessage | Message]]:
    """The window plus the turn in progress, sans I/O (both readers below drive it).

    Yields how many newest messages to read next (newest first) and receives them;
    pages grow until the turn in progress is decided.
    """
    limit = _TAIL_PAGE
    while True:
        page = yield limit
        tail = pending_turn(page, len(page) < limit)
        if tail is not None:
            return _assemble(window, tail)
        limit *= 4


def read_history_sync(store: MemoryStore, conversation_id: str,
                      view: ContextView) -> list[StoredMessage | Message]:
    """The window of ``view`` plus the turn in progress; ``[]`` for an unknown conversation."""
    try:
        window = store.window(conversation_id, view)
    except ConversationNotFoundError:
        return []
    steps = _history_steps(window.messages)
    limit = next(steps)
    while True:
        try:
            limit = steps.send(store.messages(conversation_id, limit=limit, newest_first=True))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


async def read_history(store: AnyStore, conversation_id: str,
                       view: ContextView) -> list[StoredMessage | Message]:
    """:func:`read_history_sync` for either store (awaits an AsyncMemoryStore)."""
    if isinstance(store, MemoryStore):
        return read_history_sync(store, conversation_id, view)
    try:
        window = await store.window(conversation_id, view)
    except ConversationNotFoundError:
        return []
    steps = _history_steps(window.messages)
    limit = next(steps)
    while True:
        page = await store.messages(conversation_id, limit=limit, newest_first=True)
        try:
            limit = steps.send(page)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


async def run(store: AnyStore, call: Callable[[Any], T | Awaitable[T]]) -> T:
    """Call ``call(store)``, awaiting the result for an AsyncMemoryStore."""
    result = call(store)
    if inspect.isawaitable(result):
        return cast(T, await result)
    return result
