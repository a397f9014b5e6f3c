"""What every framework adapter shares: store handling and the turn in progress.

Public API only (no SQL, no private store internals).

The turn in progress: frameworks read their history *before* they append what they
are about to add. When the newest stored message is an assistant message whose tool
calls are not all answered yet, the framework is about to add the results; every
view rightly leaves such an incomplete unit out of a window sent on its own, so the
adapters give the framework ``window + pending turn``: the window, then that call
and the results it already has. A call that is not the newest stored unit (the
conversation moved on without answering it) is never given back.

A budgeted view (``view.budgeted``, with ``token_limit`` and ``reserve``) is charged
for the turn in progress: the newest messages are read first, the pending turn is
counted with the view's counter (its own ``counter``, else the store's), and the
window is taken with ``reserve`` raised by that count, so the history returned
satisfies ``counter.count_messages(history) + reserve + tool schemas <= token_limit``.
When the pending turn alone cannot fit, `ContextBudgetError`
is raised with ``required`` and ``budget``, as views do. Other views give the window
and then the turn in progress, as they always did.

Each read is two queries (the window and the newest messages; a budgeted view reads
the newest first). A write landing between them leaves the result valid (whole
units, then at most the newest pending call) and within the budget, if one message
behind; if it answers the pending call, a budgeted window may count that call twice
and fail the budget, so a ``ContextBudgetError`` is checked against one more read of
the newest message and the history is read again (once) when the conversation moved.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, TypeVar, cast

from pydantic import ValidationError
from sqlalchemy.engine import URL

from memstore.aio import AsyncMemoryStore
from memstore.errors import (
    ConfigurationError,
    ContextBudgetError,
    ConversationNotFoundError,
    InvalidInputError,
)
from memstore.models import Message, StoredMessage
from memstore.store import MemoryStore
from memstore.tokens import TokenCounter, count_tool_schemas, counter_priming, message_tokens
from memstore.views import ContextView, UnboundedView

__all__ = [
    "AnyStore",
    "check_store",
    "check_flag",
    "check_view",
    "pending_turn",
    "read_history",
    "read_history_sync",
    "run",
    "shown",
    "store_url",
    "unescaped_json",
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


def check_flag(value: Any, name: str) -> bool:
    """A yes/no argument: ``True`` or ``False`` only (``bool("no")`` is true)."""
    if not isinstance(value, bool):
        raise InvalidInputError(f"{name} must be True or False, got {shown(value)}")
    return value


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for an error message: at most ``limit`` characters, never raising.

    ``repr`` refuses integers of more than 4,300 digits, and a class's ``__repr__`` may
    raise anything; an error message about a bad value must not fail on it.
    """
    if isinstance(value, int) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__} that cannot be shown"
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def valid_name(value: str) -> bool:
    """Whether ``value`` can be a memstore message ``name`` (asks the model itself)."""
    try:
        Message(role="user", content="", name=value)
    except ValidationError:
        return False
    return True


def store_url(store: AnyStore) -> str:
    """The store's database URL without its password (for component configs).

    A config is written to files, logs and shared, so it must not carry a secret: the
    password (in the URL or as a ``password`` query parameter) is left out entirely,
    not masked, so the URL stays valid and the password comes back from where libpq
    looks for one (``PGPASSWORD``, ``~/.pgpass``, a service file) or from a URL put
    into the config before loading it.
    """
    url = store.engine.url.difference_update_query(["password"])
    # URL.set(password=None) would keep the password: build the URL without one.
    url = URL.create(url.drivername, username=url.username, host=url.host, port=url.port,
                     database=url.database, query=url.query)
    return url.render_as_string(hide_password=False)


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


#: What `_history_steps()` asks its driver for: an int is that many newest messages
#: (newest first), a view is that view's window (its messages).
_Request = int | ContextView


def _budget_fields(view: ContextView) -> tuple[int, int] | None:
    """``(token_limit, reserve)`` of a budgeted view that has both as dataclass fields."""
    if not view.budgeted or not dataclasses.is_dataclass(view):
        return None
    names = {f.name for f in dataclasses.fields(view)}
    if not {"token_limit", "reserve"} <= names:
        return None
    limit, reserve = cast(Any, view).token_limit, cast(Any, view).reserve
    if type(limit) is not int or type(reserve) is not int:
        return None
    return limit, reserve


def _charge(view: ContextView, counter: TokenCounter, limit: int, reserve: int,
            pending: int) -> ContextView:
    """``view`` with its reserve raised by ``pending`` tokens, or ContextBudgetError."""
    tools = count_tool_schemas(counter, getattr(view, "tools", None))
    priming = counter_priming(counter)
    required = pending + priming + reserve + tools
    if required > limit or reserve + pending >= limit:
        raise ContextBudgetError(
            f"{type(view).__name__}: the turn in progress (an unanswered tool call and its "
            f"results so far: {pending} tokens) with reply priming ({priming}), reserve "
            f"({reserve}) and tool schemas ({tools}) need {required} tokens; token_limit is "
            f"{limit}{'' if required > limit else ', which leaves nothing for the window'}",
            required=required,
            budget=limit,
        )
    return cast(ContextView, dataclasses.replace(cast(Any, view), reserve=reserve + pending))


def _read_tail() -> Generator[_Request, Any, tuple[int | None, list[StoredMessage]]]:
    """Read the newest messages until the turn in progress is decided.

    Returns the newest seq (``None``: no message) and the turn in progress (``[]``:
    none). Pages grow until it is decided.
    """
    limit = _TAIL_PAGE
    while True:
        page: Sequence[StoredMessage] = yield limit
        tail = pending_turn(page, len(page) < limit)
        if tail is not None:
            return (page[0].seq if page else None), tail
        limit *= 4


def _history_steps(
    view: ContextView, counter: TokenCounter,
) -> Generator[_Request, Any, list[StoredMessage | Message]]:
    """The window plus the turn in progress, sans I/O (both readers below drive it).

    Yields what to read next (see ``_Request``) and receives it; a ``ContextBudgetError``
    of a window read is thrown in. A budgeted view is charged for the turn in progress.
    """
    budget = _budget_fields(view)
    if budget is None:
        window = yield view
        _, tail = yield from _read_tail()
        return _assemble(window, tail)
    limit, reserve = budget
    retried = False
    while True:
        newest, tail = yield from _read_tail()
        if not tail:
            window = yield view
            return _assemble(window, tail)
        pending = sum(message_tokens(m, counter) for m in tail)
        charged = _charge(view, counter, limit, reserve, pending)
        try:
            window = yield charged
        except ContextBudgetError as exc:
            if not retried:
                retried = True
                moved: Sequence[StoredMessage] = yield 1
                if (moved[0].seq if moved else None) != newest:
                    continue  # a write answered the call meanwhile: read again
            raise ContextBudgetError(
                f"{exc} (the reserve includes the turn in progress: {pending} tokens)",
                required=exc.required, budget=exc.budget,
            ) from exc
        return _assemble(window, tail)


def read_history_sync(store: MemoryStore, conversation_id: str,
                      view: ContextView) -> list[StoredMessage | Message]:
    """The window of ``view`` plus the turn in progress; ``[]`` for an unknown conversation.

    `read_history()` run without an event loop: a MemoryStore's reads never
    suspend, so its coroutine finishes at the first step.

    Raises:
        ContextBudgetError: a budgeted view cannot fit the anchored messages, the
            newest unit and the turn in progress.
    """
    coroutine = read_history(store, conversation_id, view)
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(list[StoredMessage | Message], done.value)
    coroutine.close()
    raise AssertionError("a MemoryStore read suspended")  # pragma: no cover


async def _read(store: AnyStore, conversation_id: str,
                request: _Request) -> Sequence[StoredMessage | Message]:
    """One read `_history_steps()` asks for (a MemoryStore's returns without suspending)."""
    if isinstance(request, int):
        newest = store.messages(conversation_id, limit=request, newest_first=True)
        return await newest if inspect.isawaitable(newest) else newest
    window = store.window(conversation_id, request)
    return (await window if inspect.isawaitable(window) else window).messages


async def read_history(store: AnyStore, conversation_id: str,
                       view: ContextView) -> list[StoredMessage | Message]:
    """`read_history_sync()` for either store (awaits an AsyncMemoryStore)."""
    steps = _history_steps(view, view.resolve_counter(store.counter))
    try:
        request = next(steps)
        while True:
            try:
                got = await _read(store, conversation_id, request)
            except ConversationNotFoundError:
                return []
            except ContextBudgetError as exc:
                request = steps.throw(exc)
                continue
            request = steps.send(got)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def run(store: AnyStore, call: Callable[[Any], T | Awaitable[T]]) -> T:
    """Call ``call(store)``, awaiting the result for an AsyncMemoryStore."""
    result = call(store)
    if inspect.isawaitable(result):
        return cast(T, await result)
    return result


def unescaped_json(value: Any, **options: Any) -> str:
    """``value`` as JSON with its non-ASCII text as it is (``ensure_ascii=False``).

    What frameworks send a model, so what a budget should count. Text holding a lone
    surrogate, which memstore cannot store, keeps JSON's escapes instead (it reads back
    equal); JSON escapes NUL either way. ``options`` go to ``json.dumps``.
    """
    text = json.dumps(value, ensure_ascii=False, **options)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, **options)
    return text
