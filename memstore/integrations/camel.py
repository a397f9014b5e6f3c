"""CAMEL integration: a persistent, token-budgeted ``AgentMemory`` for ``ChatAgent``.

Install with ``pip install 'memstore[camel]'``::

    from camel.agents import ChatAgent
    from memstore import MemoryStore
    from memstore.integrations.camel import MemstoreAgentMemory

    store = MemoryStore("sqlite:///agents.db")
    memory = MemstoreAgentMemory("chat-1", store, token_limit=model.token_limit)
    agent = ChatAgent("You are terse.", model=model, memory=memory,
                      summarize_threshold=None)

Every CAMEL ``MemoryRecord`` becomes one memstore message: its OpenAI form (role,
content, tool calls, tool-call id) is what memstore stores, counts and windows; the
rest of the record (uuid, backend role, CAMEL message fields, ``extra_info``,
timestamp, agent id) is kept under ``metadata["camel"]``, so a record reads back
equal. The record's uuid is the message id, so writing the same record twice
stores it once. ``get_context()`` reads only the window: by default a
[`ScoreBasedView`][memstore.ScoreBasedView] with CAMEL's own scoring rule (``keep_rate``
decay), which keeps tool calls with their results and always keeps the newest
message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar, cast

from memstore import (
    AsyncMemoryStore,
    ContextView,
    ContextWindow,
    HistorySource,
    MemoryStore,
    Message,
    ScoreBasedView,
    StoredMessage,
    WindowReport,
)
from memstore.errors import (
    ConfigurationError,
    ContextBudgetError,
    ConversationNotFoundError,
    InvalidInputError,
    MissingDependencyError,
)
from memstore.integrations._common import check_flag, shown
from memstore.tokens import TokenCounter, message_tokens

try:
    from camel.memories import AgentMemory, ContextRecord, MemoryRecord
    from camel.memories.base import BaseContextCreator
    from camel.messages import BaseMessage, FunctionCallingMessage, OpenAIMessage
    from camel.types import ModelType, OpenAIBackendRole, RoleType
    from camel.utils import BaseTokenCounter
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError(
        "memstore.integrations.camel needs CAMEL: pip install 'memstore[camel]'"
    ) from exc

__all__ = ["ContextOverflowError", "MemstoreAgentMemory", "MemstoreContextCreator",
           "MemstoreTokenCounter", "message_to_record", "record_to_message"]

#: The metadata key under which a record's CAMEL-only fields are stored.
METADATA_KEY = "camel"
_PAGE = 500
_T = TypeVar("_T")


class ContextOverflowError(ContextBudgetError, RuntimeError):
    """The system messages and the newest unit do not fit the memory's budget.

    A [`ContextBudgetError`][memstore.ContextBudgetError] that is also the ``RuntimeError`` CAMEL's
    context creators raise, with ``args[1]`` the tokens required: ``ChatAgent`` ends the
    step with termination reason ``"max_tokens_exceeded"``, as with its own memory.
    """

    def __init__(self, error: ContextBudgetError) -> None:
        super().__init__(str(error), required=error.required, budget=error.budget)
        self.args = (str(error), error.required)


# ---- record <-> message ------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (CAMEL tool results may be any object: ``str()``-ed)."""
    return json.loads(json.dumps(value, default=str))


def _projection(record: MemoryRecord) -> dict[str, Any]:
    """The OpenAI chat dict memstore stores for ``record`` (what CAMEL would send)."""
    role = record.role_at_backend
    message = record.message
    if role in (OpenAIBackendRole.FUNCTION, OpenAIBackendRole.TOOL):
        if isinstance(message, FunctionCallingMessage):
            return dict(message.to_openai_tool_message())
        raise InvalidInputError(
            f"a {role.value} record needs a FunctionCallingMessage, not {type(message).__name__}"
        )
    if role == OpenAIBackendRole.DEVELOPER:
        return {"role": "developer", "content": message.content}
    return dict(record.to_openai_message())


def record_to_message(record: MemoryRecord) -> Message:
    """Convert a CAMEL ``MemoryRecord`` to the memstore message that stores it.

    The role, content, tool calls and tool-call id come from the record's OpenAI form;
    the record's other fields go to ``metadata["camel"]`` (the record dict without the
    message text when the text is already the message's content). The message ``id``
    is the record's uuid. The base importance ``score`` is ``extra_info["score"]``
    when the record has one (CAMEL records carry no score of their own), else 1.0.

    Raises:
        pydantic.ValidationError: the record's OpenAI form is not a valid message.
        InvalidInputError: a function/tool record that is not a FunctionCallingMessage,
            or an ``extra_info["score"]`` that is not a number.
    """
    try:
        projection = _projection(record)
        data = _jsonable(record.to_dict())
    except RecursionError:
        raise InvalidInputError("the record is nested too deeply to store as JSON") from None
    except (TypeError, ValueError) as exc:  # (an InvalidInputError is a ValueError)
        if isinstance(exc, InvalidInputError):
            raise
        raise InvalidInputError(f"the record cannot be stored as JSON: {exc}") from exc
    score = 1.0
    raw_score = record.extra_info.get("score")
    if raw_score is not None:
        try:
            score = float(raw_score)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidInputError(
                f"record extra_info['score'] must be a number, got {shown(raw_score)}"
            ) from exc
    tool_calls = projection.get("tool_calls")
    fields: dict[str, Any] = {
        "role": projection["role"],
        "content": projection.get("content"),
        "score": score,
        "id": str(record.uuid),
    }
    if tool_calls:
        fields["tool_calls"] = tool_calls
    if projection.get("tool_call_id") is not None:
        fields["tool_call_id"] = projection["tool_call_id"]
    message = Message.from_openai(fields)
    if data["message"].get("content") == message.text:
        del data["message"]["content"]
    return Message.from_openai(fields, metadata={METADATA_KEY: data})


def _role_type(message: Message) -> RoleType:
    return RoleType.USER if message.role == "user" else RoleType.ASSISTANT


def _foreign_record(message: StoredMessage) -> MemoryRecord:
    """A record for a message that memstore holds but CAMEL did not write."""
    role = OpenAIBackendRole(message.role)
    name = message.name or message.role
    if message.role == "tool":
        camel_message: BaseMessage = FunctionCallingMessage(
            role_name=name, role_type=RoleType.ASSISTANT, meta_dict=None, content="",
            func_name=name, result=message.text, tool_call_id=message.tool_call_id)
        role = OpenAIBackendRole.FUNCTION
    else:
        meta = ({"tool_calls": [c.to_openai() for c in message.tool_calls]}
                if message.tool_calls else None)
        camel_message = BaseMessage(role_name=name, role_type=_role_type(message),
                                    meta_dict=meta, content=message.text)
    return MemoryRecord(message=camel_message, role_at_backend=role,
                        uuid=_record_uuid(message), timestamp=message.created_at.timestamp())


def _record_uuid(message: StoredMessage) -> uuid.UUID:
    """The uuid of the record a stored message reads back as: its id, or one derived from it.

    A record CAMEL wrote has its uuid as message id; a message another writer stored
    (any id) gets a uuid derived from its conversation and id.
    """
    try:
        return uuid.UUID(message.id)
    except ValueError:
        return uuid.uuid5(uuid.NAMESPACE_URL, f"memstore:{message.conversation_id}:{message.id}")


def message_to_record(message: StoredMessage) -> MemoryRecord:
    """Convert a stored message back to the CAMEL ``MemoryRecord`` it was written from.

    A message that CAMEL did not write (no ``metadata["camel"]``) becomes an
    equivalent record: its id as uuid (or a uuid derived from it), ``created_at`` as
    timestamp.
    """
    data = message.metadata.get(METADATA_KEY)
    if not isinstance(data, dict) or not isinstance(data.get("message"), dict):
        return _foreign_record(message)
    record_dict: dict[str, Any] = json.loads(json.dumps(data))
    if "content" not in record_dict["message"]:
        record_dict["message"]["content"] = message.text
    try:
        return MemoryRecord.from_dict(record_dict)
    except (TypeError, ValueError, KeyError, AttributeError):
        # Not a record CAMEL wrote (another writer's metadata under the key, or a
        # damaged one): the message's equivalent record, so one bad row does not make
        # every later read of the memory fail.
        return _foreign_record(message)


def _to_openai(message: Message) -> OpenAIMessage:
    """What CAMEL would send for a window message (its record's own OpenAI form)."""
    if isinstance(message, StoredMessage) and isinstance(
            message.metadata.get(METADATA_KEY), dict):
        try:
            return _projection(message_to_record(message))  # type: ignore[return-value]
        except (TypeError, ValueError, RecursionError):
            pass  # a record CAMEL cannot render: the message's own OpenAI form
    return message.to_openai()  # type: ignore[return-value]


# ---- system prompts ------------------------------------------------------------------------
#
# A ChatAgent writes its system message when it adopts the memory. When that prompt
# differs from the conversation's newest system message (the prompt changed between
# runs), it is stored once, after the history, and its record's ``extra_info`` names
# the record it replaces. The replaced prompt stays stored (history, ``retrieve()``)
# but is never sent: the model gets the current prompt, in the replaced one's place.

#: The ``extra_info`` key of a system record that replaced the agent's previous system
#: prompt when an agent resumed the conversation: the uuid of the record it replaced.
REPLACES_KEY = "memstore_replaces"


def _replaces(message: StoredMessage | Message) -> str | None:
    """The record uuid a system message names as the prompt it replaced, if any."""
    if message.role != "system":
        return None
    data = message.metadata.get(METADATA_KEY)
    extra = data.get("extra_info") if isinstance(data, dict) else None
    value = extra.get(REPLACES_KEY) if isinstance(extra, dict) else None
    return value if isinstance(value, str) else None


def _uuid_of(message: StoredMessage | Message) -> str | None:
    """The record uuid of a stored system message (``None`` for anything else)."""
    if not isinstance(message, StoredMessage) or message.role != "system":
        return None
    return str(_record_uuid(message))


def _with_current(items: Sequence[_T], key: Callable[[_T], str | None],
                  replaces: Callable[[_T], str | None]) -> tuple[list[_T], list[_T]]:
    """``items`` with each replaced prompt swapped for the prompt that replaces it.

    ``key`` is a system prompt's record uuid (``None``: not a system prompt),
    ``replaces`` the uuid it names as replaced. The newest prompt of a chain of
    replacements (v1 replaced by v2, v2 by v3) takes the place of the oldest one
    present (an agent's prompt stands first); the replaced ones are left out.
    Returns the items and those left out.
    """
    replacing: dict[str, _T] = {}
    for item in items:
        replaced = replaces(item) if key(item) is not None else None
        if replaced is not None:
            replacing[replaced] = item
    if not replacing:
        return list(items), []
    out: list[_T] = []
    left_out: list[_T] = []
    placed: set[int] = set()
    for item in items:
        name = key(item)
        if name is not None and name in replacing:
            left_out.append(item)
            current = replacing[name]
            seen = {name}
            while (nxt := key(current)) is not None and nxt in replacing and nxt not in seen:
                seen.add(nxt)
                current = replacing[nxt]
            item = current
        if id(item) not in placed:
            placed.add(id(item))
            out.append(item)
    return out, left_out


def _current_prompts(
    messages: Sequence[StoredMessage | Message], counter: TokenCounter,
) -> tuple[list[StoredMessage | Message], int]:
    """``messages`` with the current prompts in place of those they replaced.

    See `_with_current()`. Also returns the tokens of the replaced prompts, which
    are left out.
    """
    out, left_out = _with_current(messages, _uuid_of, _replaces)
    return out, sum(message_tokens(m, counter) for m in left_out)


def _token_limit(view: ContextView) -> int | None:
    """The ``token_limit`` of a budgeted dataclass view (one that can be raised), else None."""
    if not view.budgeted or not dataclasses.is_dataclass(view):
        return None
    if "token_limit" not in {f.name for f in dataclasses.fields(view)}:
        return None
    limit = getattr(view, "token_limit", None)
    return limit if type(limit) is int else None


def _lowered(error: ContextBudgetError, extra: int) -> ContextBudgetError:
    """A budget error of a window read with ``token_limit`` raised by ``extra``, as the view's.

    Replaced prompts (``extra`` tokens) are neither sent nor charged.
    """
    if not extra or error.required is None or error.budget is None:
        return error
    return ContextBudgetError(
        f"{error} (read with token_limit raised by the {extra} tokens of replaced system "
        f"prompts, which are not sent: {error.required - extra} tokens needed, token_limit "
        f"is {error.budget - extra})",
        required=error.required - extra, budget=error.budget - extra,
    )


def _record_key(record: ContextRecord) -> str | None:
    memory_record = record.memory_record
    if memory_record.role_at_backend != OpenAIBackendRole.SYSTEM:
        return None
    return str(memory_record.uuid)


def _current_records(records: Sequence[ContextRecord]) -> list[ContextRecord]:
    """Context records with the current prompts in place of those they replaced."""
    return _with_current(records, _record_key,
                         lambda r: r.memory_record.extra_info.get(REPLACES_KEY))[0]


@dataclass(frozen=True)
class _SystemMessages(ContextView):
    """Every stored system message, chronological: what resuming compares a prompt with.

    System messages are anchored, and a store reads its anchored messages with the
    conversation (one indexed read): this costs what they hold, not the history.
    Not a context for a model.
    """

    def select(self, source: HistorySource, counter: TokenCounter) -> ContextWindow:
        messages: list[StoredMessage | Message] = [
            m for m in source.anchored() if m.role == "system"]
        return ContextWindow(
            conversation_id=source.conversation_id, messages=messages,
            token_count=sum(message_tokens(m, counter) for m in messages),
            report=WindowReport(view=type(self).__name__, counter=counter.name,
                                conversation_message_count=source.message_count,
                                included_count=len(messages), rows_read=source.rows_read),
        )


# ---- the store, seen synchronously ---------------------------------------------------------

_TWINS: weakref.WeakKeyDictionary[AsyncMemoryStore, MemoryStore] = weakref.WeakKeyDictionary()
_TWINS_LOCK = threading.Lock()
_SYNC_DRIVERS = {"sqlite+aiosqlite": "sqlite", "postgresql+asyncpg": "postgresql+psycopg"}


def _sync_store(store: MemoryStore | AsyncMemoryStore) -> MemoryStore:
    """The synchronous store CAMEL's synchronous memory API runs on.

    CAMEL calls its memory synchronously, also from ``ChatAgent.astep`` inside a running
    event loop, so an ``AsyncMemoryStore`` cannot be awaited there. Its database is
    reached through one synchronous twin per async store (same URL with the matching
    synchronous driver, same counter), created on first use, shared by every memory
    on that store and closed when the async store is garbage-collected.
    """
    if isinstance(store, MemoryStore):
        return store
    if not isinstance(store, AsyncMemoryStore):
        raise ConfigurationError(
            f"store must be a MemoryStore or an AsyncMemoryStore, not {type(store).__name__}"
        )
    with _TWINS_LOCK:
        twin = _TWINS.get(store)
        if twin is None:
            url = store.engine.url
            driver = _SYNC_DRIVERS.get(url.drivername, url.drivername)
            if driver == "sqlite" and url.database in (None, "", ":memory:"):
                raise ConfigurationError(
                    "an in-memory SQLite AsyncMemoryStore cannot be shared with CAMEL's "
                    "synchronous memory API: use a MemoryStore or a database file"
                )
            twin = MemoryStore(url.set(drivername=driver).render_as_string(hide_password=False),
                               counter=store.counter)
            _TWINS[store] = twin
            weakref.finalize(store, twin.close)  # its connections close with the async store
        return twin


# ---- token counter and context creator -----------------------------------------------------


class MemstoreTokenCounter(BaseTokenCounter):
    """CAMEL's ``BaseTokenCounter`` over a memstore [`TokenCounter`][memstore.TokenCounter].

    ``count_tokens_from_messages`` counts the list as memstore does (per-message counts
    plus reply priming once), so it agrees with the token counts of windows.
    ``encode``/``decode`` need a tokenizer: they work when the counter has an
    ``encoding`` (``TiktokenCounter``) and raise ``NotImplementedError`` otherwise.
    """

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter

    def count_tokens_from_messages(self, messages: list[OpenAIMessage]) -> int:
        """Count an OpenAI message list with the memstore counter."""
        return self.counter.count_messages([Message.from_openai(dict(m)) for m in messages])

    def _encoding(self) -> Any:
        encoding = getattr(self.counter, "encoding", None)
        if encoding is None or not hasattr(encoding, "encode"):
            raise NotImplementedError(
                f"token counter {self.counter.name!r} has no tokenizer to encode/decode with"
            )
        return encoding

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (tiktoken counters only)."""
        return list(self._encoding().encode(text))

    def decode(self, token_ids: list[int]) -> str:
        """Text of ``token_ids`` (tiktoken counters only)."""
        return str(self._encoding().decode(token_ids))


class MemstoreContextCreator(BaseContextCreator):
    """CAMEL's context creator for a memstore view (``MemstoreAgentMemory`` uses it).

    ``token_limit`` is the view's budget (``None`` for a view without one; ChatAgent then
    uses its model's limit when it copies the setting). ``create_context(records)`` runs
    the same view over a list of records (they are numbered in list order), so it
    selects what ``get_context()`` would over the same history.
    """

    def __init__(self, view: ContextView, counter: TokenCounter) -> None:
        self.view = view
        self._counter = view.resolve_counter(counter)
        self._token_counter = MemstoreTokenCounter(self._counter)

    @property
    def token_counter(self) -> BaseTokenCounter:
        """The counter as a CAMEL token counter."""
        return self._token_counter

    @property
    def token_limit(self) -> int | None:  # type: ignore[override]
        """The view's token budget (``None`` when the view has none)."""
        limit = getattr(self.view, "token_limit", None)
        return limit if isinstance(limit, int) else None

    def create_context(self, records: list[ContextRecord]) -> tuple[list[OpenAIMessage], int]:
        """Select ``records`` through the view: ``(openai_messages, token_count)``.

        System records that a later prompt replaced (see ``MemstoreAgentMemory``) are
        left out before the view runs, as ``get_context()`` leaves them out.
        """
        records = _current_records(records)
        stored: list[StoredMessage] = []
        for seq, context_record in enumerate(records, start=1):
            message = record_to_message(context_record.memory_record)
            stored.append(StoredMessage.model_validate({
                **message.model_dump(), "conversation_id": "camel", "seq": seq,
                "created_at": datetime.fromtimestamp(context_record.memory_record.timestamp,
                                                     tz=timezone.utc),
                "token_count": self._counter.count_message(message),
                "token_counter": self._counter.name,
            }))
        if not stored:
            return [], 0
        try:
            window = self.view.apply(stored, self._counter)
        except ContextBudgetError as exc:
            raise ContextOverflowError(exc) from exc
        return [_to_openai(m) for m in window.messages], window.token_count


# ---- the memory ----------------------------------------------------------------------------


class MemstoreAgentMemory(AgentMemory):
    """A CAMEL ``AgentMemory`` that keeps one conversation in a memstore database.

    Pass it to ``ChatAgent(memory=...)``. ``write_records`` stores each record once
    (its uuid is the message id); ``get_context()`` returns the window of ``view`` as
    ``(openai_messages, token_count)`` and reads only that window.

    Budget: CAMEL passes the token limit to a memory through its context creator
    (``ChatHistoryMemory(ScoreBasedContextCreator(counter, token_limit))``); ChatAgent
    builds one only for its default memory. Give the limit here, normally your
    model's: ``token_limit=model.token_limit``. Without ``token_limit`` and ``view``
    the budget is the context window of CAMEL's default model (``ModelType.DEFAULT``),
    the limit ChatAgent itself uses when given no model. The default view is
    ``ScoreBasedView(token_limit, keep_rate=keep_rate)``: CAMEL's scoring rule
    (the j-th newest non-system message scores ``keep_rate**j``) with none of its
    bugs (tool calls stay with their results, the newest message is always kept,
    the limit is always respected). ChatAgent also compresses its memory by
    summarisation when a context passes ``summarize_threshold`` percent of its token
    limit, which *clears* the memory: with a budgeted memory pass
    ``summarize_threshold=None``.

    Resuming: ``ChatAgent.__init__`` sets the memory's ``agent_id`` and then clears
    it and writes its system message. With ``resume=True`` (default) a memory that an
    agent adopts keeps its stored history: that first ``clear()`` after the agent sets
    ``agent_id`` (only that one, with or without a system message) is skipped, and the
    agent's system message is compared with the conversation's newest stored system
    message, wherever it stands. The same prompt is not stored again. A changed
    prompt is stored once, after the history, as a new system message that replaces
    the previous one (its record's ``extra_info["memstore_replaces"]`` names the
    replaced record): the next agent with that prompt finds it and stores nothing.
    Every other ``clear()`` (also ``agent.reset()``) deletes the conversation's
    messages.

    What is sent: the model gets the *current* prompt only, in the place of the prompt
    it replaced (first, for an agent's prompt). A replaced prompt stays stored
    (``retrieve()`` and the store return it, as history) but ``get_context()`` and the
    context creator leave it out, and a budgeted view's budget is not spent on it: the
    window is what the view would select if the replaced prompt were not stored.
    Every other system message is sent where the view keeps it.

    Args:
        conversation_id: the memstore conversation (created on the first write).
        store: a [`MemoryStore`][memstore.MemoryStore] or an
            [`AsyncMemoryStore`][memstore.AsyncMemoryStore]
            (CAMEL's memory API is synchronous: an async store is reached through a
            synchronous twin on the same database, see ``_sync_store``).
        view: the view ``get_context()`` reads through (default: ScoreBasedView).
        token_limit: the default view's budget (only without ``view``).
        keep_rate: the default view's decay per message (only without ``view``).
        agent_id: the agent id stamped on records written without one.
        resume: keep the stored history when a ChatAgent adopts this memory.

    Raises:
        ConfigurationError: both ``view`` and ``token_limit`` given, or an invalid
            store, limit or keep rate.
    """

    def __init__(
        self,
        conversation_id: str,
        store: MemoryStore | AsyncMemoryStore,
        *,
        view: ContextView | None = None,
        token_limit: int | None = None,
        keep_rate: float = 0.9,
        agent_id: str | None = None,
        resume: bool = True,
    ) -> None:
        if view is not None and token_limit is not None:
            raise ConfigurationError("give view= or token_limit=, not both")
        if view is not None and not isinstance(view, ContextView):
            raise ConfigurationError(f"view must be a memstore view, not {type(view).__name__}")
        if view is None:
            limit = token_limit if token_limit is not None else ModelType.DEFAULT.token_limit
            view = ScoreBasedView(token_limit=limit, keep_rate=keep_rate)
        self._store = _sync_store(store)
        self.conversation_id = self._store.context(conversation_id, view).conversation_id
        self.view = view
        self.keep_rate = getattr(view, "keep_rate", keep_rate)
        self._creator = MemstoreContextCreator(view, self._store.counter)
        self._agent_id = agent_id
        self._resume = check_flag(resume, "resume")
        # Adoption by a ChatAgent (see the class doc): the first clear() after the
        # agent_id setter is skipped (``_skip_clear``), and that skip arms
        # ``_skip_system`` for the system message the agent writes right after. Both are
        # one-shot: any other memory call disarms them, so later clears always clear.
        self._skip_clear = False
        self._skip_system = False
        # Tokens of the replaced prompts in the window last read (see _context): the
        # next window is read with the view's token_limit raised by that much.
        self._replaced_tokens = 0

    # ---- AgentMemory ---------------------------------------------------------------------

    @property
    def agent_id(self) -> str | None:
        """The id stamped on records written without one (ChatAgent sets it)."""
        return self._agent_id

    @agent_id.setter
    def agent_id(self, val: str | None) -> None:
        self._agent_id = val
        self._skip_clear = self._resume
        self._skip_system = False

    def get_context_creator(self) -> BaseContextCreator:
        """The context creator (its ``token_limit`` is the view's budget)."""
        return self._creator

    def get_context(self) -> tuple[list[OpenAIMessage], int]:
        """The view's window as ``(openai_messages, token_count)``; ``([], 0)`` when empty.

        Reads only the window (cost grows with the window, not the history). System
        prompts that a later one replaced are not in it (see the class doc).

        Raises:
            ContextOverflowError: the system messages and the newest unit do not fit the
                budget (a ``ContextBudgetError`` and the ``RuntimeError`` ChatAgent
                handles).
        """
        self._settled()
        try:
            messages, tokens = self._context()
        except ConversationNotFoundError:
            return [], 0
        except ContextBudgetError as exc:
            raise ContextOverflowError(exc) from exc
        return [_to_openai(m) for m in messages], tokens

    def _context(self) -> tuple[list[StoredMessage | Message], int]:
        """The view's window without replaced prompts, and its token count.

        A replaced prompt is a system message, anchored, so a view charges it before
        anything else: a budgeted view's window is read with its ``token_limit``
        raised by the replaced prompts' tokens (known from the previous read), which
        leaves the rest exactly the room it has without them. When the read finds
        another amount (the first read after a prompt changed, or a concurrent writer),
        it is read again with that amount; if the amount keeps changing, the view as
        given is read, whose window holds the replaced prompts and so fits without them.
        Other views' windows are read as they are, and the replaced prompts left out.
        """
        counter = self.view.resolve_counter(self._store.counter)
        limit = _token_limit(self.view)
        if limit is None:
            window = self._store.window(self.conversation_id, self.view)
            kept, freed = _current_prompts(window.messages, counter)
            return kept, window.token_count - freed
        extra = self._replaced_tokens
        for attempt in range(3):
            view = (cast(ContextView, dataclasses.replace(cast(Any, self.view),
                                                          token_limit=limit + extra))
                    if extra else self.view)
            try:
                window = self._store.window(self.conversation_id, view)
            except ContextBudgetError as exc:
                # it may fit without the replaced prompts, which the read above charged
                _, freed = _current_prompts(self._system_messages(), counter)
                if freed != extra and attempt < 2:
                    extra = self._replaced_tokens = freed
                    continue
                raise _lowered(exc, extra) from exc
            kept, freed = _current_prompts(window.messages, counter)
            if freed == extra:
                return kept, window.token_count - freed
            extra = self._replaced_tokens = freed
        window = self._store.window(self.conversation_id, self.view)
        kept, freed = _current_prompts(window.messages, counter)
        return kept, window.token_count - freed

    def write_records(self, records: list[MemoryRecord]) -> None:
        """Store records at the end of the conversation, in one transaction.

        Records without an ``agent_id`` get this memory's. A record whose uuid is already
        stored with the same content is not stored again.

        Raises:
            InvalidInputError: a record cannot be stored (nothing is written).
            pydantic.ValidationError: a record's OpenAI form is not a valid message.
            ConflictError: a record's uuid is stored with other content.
        """
        records = list(records)
        for record in records:
            if record.agent_id == "" and self._agent_id is not None:
                record.agent_id = self._agent_id
        self._skip_clear = False
        if self._skip_system:
            self._skip_system = False
            records = self._skip_restored_system(records)
        if records:
            self._store.extend(self.conversation_id, [record_to_message(r) for r in records])

    def _skip_restored_system(self, records: list[MemoryRecord]) -> list[MemoryRecord]:
        """The adopting agent's records, its system message compared with the stored one.

        The conversation's current prompt is its newest system message, wherever it
        stands (a changed prompt is stored after the history it follows). The same
        prompt is not stored again; another one is stored, once, naming the record it
        replaces (see the class doc).
        """
        if not records or records[0].role_at_backend != OpenAIBackendRole.SYSTEM:
            return records
        systems = self._system_messages()
        if not systems:
            return records
        current = systems[-1]
        if current.text == records[0].message.content:
            return records[1:]
        prompt = records[0].model_copy(update={"extra_info": {
            **records[0].extra_info, REPLACES_KEY: str(_record_uuid(current))}})
        return [prompt, *records[1:]]

    def retrieve(self) -> list[ContextRecord]:
        """Every stored record, chronological, scored by CAMEL's rule.

        System records score 1.0; the j-th newest other record scores
        ``score * keep_rate**j``. CAMEL uses this to copy a memory (``clone``,
        ``save_memory``, the ``memory`` setter): it reads the whole conversation.
        Model contexts come from `get_context()`, which reads only the window.
        """
        self._settled()
        messages = list(self._iter_stored())
        scores: list[float] = [1.0] * len(messages)
        factor = 1.0
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            if message.role != "system":
                factor *= self.keep_rate
                scores[index] = message.score * factor
        return [
            ContextRecord(memory_record=record, score=score, timestamp=record.timestamp)
            for record, score in zip((message_to_record(m) for m in messages), scores)
        ]

    def clear(self) -> None:
        """Delete the conversation's messages (see the class doc for ChatAgent adoption)."""
        self._skip_system = False
        if self._skip_clear:  # the clear() of ChatAgent adopting the memory: only that one
            self._skip_clear = False
            if self._stored(limit=1):
                self._skip_system = True  # the agent's system message comes next
                return
        with contextlib.suppress(ConversationNotFoundError):
            self._store.clear(self.conversation_id)

    def pop_records(self, count: int) -> list[MemoryRecord]:
        """Delete up to ``count`` newest records and return them (chronological).

        A system or developer record at the start of the conversation is never
        removed (CAMEL's rule).

        Raises:
            TypeError: ``count`` is not an int.
            ValueError: ``count`` is negative.
        """
        if not isinstance(count, int) or isinstance(count, bool):
            raise TypeError("count must be an integer")
        if count < 0:
            raise ValueError("count must be non-negative")
        self._settled()
        if count == 0:
            return []
        try:
            total = self._store.get_conversation(self.conversation_id).message_count
        except ConversationNotFoundError:
            return []
        first = self._stored(limit=1)
        removable = total - (1 if first and first[0].role in ("system", "developer") else 0)
        n = min(count, removable)
        if n <= 0:
            return []
        return [message_to_record(m) for m in self._store.pop(self.conversation_id, n)]

    def remove_records_by_indices(self, indices: list[int]) -> list[MemoryRecord]:
        """Delete the records at ``indices`` (positions in `retrieve()` order).

        Out-of-range indices are ignored, and so is index 0 when it is a system or
        developer record (CAMEL's rule). One transaction (``store.rewrite``: it reads the
        whole conversation), so a record another writer adds meanwhile is never lost;
        the indices are positions in the conversation as that transaction reads it.
        Returns the removed records in their original order.
        """
        self._settled()
        wanted = set(indices)

        def drop(messages: list[StoredMessage]) -> set[int]:
            out = {i for i in wanted if isinstance(i, int) and 0 <= i < len(messages)}
            if messages and messages[0].role in ("system", "developer"):
                out.discard(0)
            return out

        return self._remove(drop)

    def clean_tool_calls(self) -> None:
        """Delete every tool call and tool result (CAMEL's ``prune_tool_calls_from_memory``).

        Removes assistant messages with tool calls and tool messages in one transaction
        (``store.rewrite``); the rest of the history keeps its ids, timestamps and
        scores, and a record another writer adds meanwhile is never lost.
        """
        self._settled()
        self._remove(lambda messages: {i for i, m in enumerate(messages)
                                       if m.role == "tool" or m.tool_calls})

    # ---- helpers -------------------------------------------------------------------------

    def _remove(self, drop: Callable[[list[StoredMessage]], set[int]]) -> list[MemoryRecord]:
        """Delete the messages ``drop`` picks, in one transaction; returns their records.

        ``drop`` sees the whole conversation as the rewrite's transaction reads it (the
        conversation locked), so nothing written meanwhile is lost. The kept messages
        keep their identity (only their seqs close up); summaries of removed messages
        go (see ``MemoryStore.rewrite``).
        """
        removed: list[StoredMessage] = []

        def keep(messages: list[StoredMessage]) -> list[StoredMessage]:
            gone = drop(messages)
            removed[:] = [m for i, m in enumerate(messages) if i in gone]
            return [m for i, m in enumerate(messages) if i not in gone]

        try:
            self._store.rewrite(self.conversation_id, keep)
        except ConversationNotFoundError:
            return []
        return [message_to_record(m) for m in removed]

    def _settled(self) -> None:
        """Disarm the adoption skips: the agent is done adopting this memory."""
        self._skip_clear = False
        self._skip_system = False

    def _system_messages(self) -> list[StoredMessage]:
        """Every stored system message, chronological (one read of the anchored ones)."""
        try:
            window = self._store.window(self.conversation_id, _SystemMessages())
        except ConversationNotFoundError:
            return []
        return [m for m in window.messages if isinstance(m, StoredMessage)]

    def _stored(self, limit: int) -> list[StoredMessage]:
        try:
            return self._store.messages(self.conversation_id, limit=limit)
        except ConversationNotFoundError:
            return []

    def _iter_stored(self) -> Iterator[StoredMessage]:
        start: int | None = None
        while True:
            try:
                page: Sequence[StoredMessage] = self._store.messages(
                    self.conversation_id, start=start, limit=_PAGE)
            except ConversationNotFoundError:
                return
            yield from page
            if len(page) < _PAGE:
                return
            start = page[-1].seq + 1
