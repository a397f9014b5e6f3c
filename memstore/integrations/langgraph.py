"""LangGraph integration: memstore as a graph's conversation memory.

Install with ``pip install 'memstore[langgraph]'`` (langgraph 1.x, langchain-core 1.x).

`MemstoreGraphMemory` feeds the window of a memstore view into the model call of a
LangGraph graph and stores the messages the graph produces, so the model is given a
token-budgeted history read in time that grows with the window, and the conversation
survives restarts and is shared by every process on the database::

    from memstore import MemoryStore, TokenLimitedView
    from memstore.integrations.langgraph import MemstoreGraphMemory, thread_id

    memory = MemstoreGraphMemory(thread_id, MemoryStore(), view=TokenLimitedView(8000))

    def call_model(state: MessagesState, config: RunnableConfig) -> dict:
        reply = model.invoke(memory.load(state, config))   # stores the new input first
        memory.save([reply], config)
        return {"messages": [reply]}

or, for ``langgraph.prebuilt.create_react_agent``, its two hooks:
``create_react_agent(model, tools, pre_model_hook=memory.pre_model_hook,
post_model_hook=memory.post_model_hook)``.

It is not a checkpointer: graph state (and with it interrupts, time travel and
resuming a run) is LangGraph's job. The graph's own state holds the run's messages,
memstore holds the conversation; a graph with a checkpointer too works the same.

Which messages are stored: those of the graph state that come after the newest one
already stored (same LangChain message id, equal content; LangGraph's ``add_messages``
gives every state message an id), found among the conversation's newest messages.
Storing is therefore idempotent: a node that runs again stores nothing twice.
Messages are mapped by the LangChain adapter's ``to_memstore`` / ``from_memstore``
(``memstore.integrations.langchain``; lossless).

Stores: with a [`MemoryStore`][memstore.MemoryStore] every method works (the async ones
call the store directly); with an [`AsyncMemoryStore`][memstore.AsyncMemoryStore], use
the async ones (``aload``, ``asave``, ``ahistory``; the hooks run them under
``ainvoke``/``astream``); the sync ones raise a
[`ConfigurationError`][memstore.ConfigurationError] saying so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar, cast

from memstore import AsyncMemoryStore, ContextView, StoredMessage, UnboundedView
from memstore.errors import (
    ConfigurationError,
    ConversationNotFoundError,
    InvalidInputError,
    MissingDependencyError,
)
from memstore.integrations._common import (
    AnyStore,
    check_conversation,
    check_store,
    check_view,
    read_history,
    run,
    shown,
)

try:
    from langchain_core.messages import BaseMessage
    from langchain_core.runnables import RunnableConfig, RunnableLambda

    from memstore.integrations.langchain import from_memstore, to_memstore
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependencyError(
        "memstore.integrations.langgraph needs langchain-core>=1 (and langgraph): "
        "pip install 'memstore[langgraph]'"
    ) from exc

__all__ = ["MemstoreGraphMemory", "thread_id"]

_T = TypeVar("_T")
#: The first page of newest stored messages read to find what a state already stored.
_FIRST_PAGE = 8
#: The view a conversation id is checked with (no I/O).
_ALL = UnboundedView()


def thread_id(config: RunnableConfig) -> str:
    """The run's ``config["configurable"]["thread_id"]``: LangGraph's conversation id.

    Give it as ``conversation_id`` to use one memstore conversation per LangGraph
    thread: ``MemstoreGraphMemory(thread_id, store)``.

    Raises:
        InvalidInputError: the run was not given a ``thread_id``.
    """
    configurable = config.get("configurable") if isinstance(config, Mapping) else None
    value = configurable.get("thread_id") if isinstance(configurable, Mapping) else None
    if value is None:
        raise InvalidInputError(
            "the run has no thread_id: invoke the graph with "
            "config={'configurable': {'thread_id': ...}}, or give MemstoreGraphMemory a "
            "conversation id")
    return str(value)


def _messages(state: Any) -> list[BaseMessage]:
    """The messages of a graph state (a dict or object with ``messages``) or a list."""
    if isinstance(state, BaseMessage):
        return [state]
    if isinstance(state, Mapping):
        value = state.get("messages")
    elif isinstance(state, Sequence) and not isinstance(state, (str, bytes)):
        value = state
    else:
        value = getattr(state, "messages", None)
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) \
            or not all(isinstance(m, BaseMessage) for m in value):
        raise InvalidInputError(
            "expected a graph state with a list of LangChain messages under 'messages', or "
            f"such a list, got {shown(state)}")
    return list(value)


async def _newest(store: AnyStore, cid: str, limit: int) -> list[StoredMessage]:
    """The ``limit`` newest stored messages of a conversation, newest first."""
    return await run(store, lambda s: s.messages(cid, limit=limit, newest_first=True))


def _now(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine over a MemoryStore to its end: such a coroutine never suspends."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(_T, done.value)
    coroutine.close()
    raise AssertionError("a MemoryStore call suspended")  # pragma: no cover


class MemstoreGraphMemory:
    """A LangGraph graph's conversation memory, stored in memstore.

    ``load(state, config)`` stores the state's messages that are not stored yet (the
    user's input, tool results) and returns the history to send the model: the window
    of ``view`` (default: every complete unit), then the turn in progress (an
    ``AIMessage`` whose tool calls are not all answered, with the results stored so
    far) while it is the newest unit. A budgeted view is charged for that turn, so the
    history fits its ``token_limit`` (leave room in ``reserve`` for a system prompt the
    graph adds). ``save(messages, config)`` stores what is not stored yet (a model's
    reply). ``clear(config)`` deletes the conversation's messages. The conversation is
    ``conversation_id``, or what it returns for the run's config (`thread_id`:
    LangGraph's ``thread_id``).

    Args:
        conversation_id: a memstore conversation id, or a function of the run's
            ``RunnableConfig`` returning one (such as `thread_id`).
        store: a MemoryStore or an AsyncMemoryStore (async methods only).
        view: the view deciding what ``load``/``history`` return; default: every
            complete unit (``UnboundedView``).

    Example:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> from memstore import MemoryStore, TokenLimitedView
        >>> from memstore.integrations.langgraph import MemstoreGraphMemory
        >>> memory = MemstoreGraphMemory("chat-1", MemoryStore("sqlite://"),
        ...                              view=TokenLimitedView(token_limit=4000))
        >>> state = {"messages": [HumanMessage("Hi", id="h1")]}
        >>> [m.content for m in memory.load(state)]
        ['Hi']
        >>> [m.id for m in memory.save([AIMessage("Hello!", id="a1")])]
        ['a1']
        >>> [m.content for m in memory.history()]
        ['Hi', 'Hello!']
    """

    def __init__(self, conversation_id: str | Callable[[RunnableConfig], str],
                 store: AnyStore, *, view: ContextView | None = None) -> None:
        self._store = check_store(store, "MemstoreGraphMemory")
        self._view = check_view(view, "MemstoreGraphMemory")
        if callable(conversation_id):
            self._conversation: str | Callable[[RunnableConfig], str] = conversation_id
        else:
            self._conversation = check_conversation(self._store, conversation_id, self._view,
                                                    "conversation_id")
        self._pre = RunnableLambda(self._pre_hook, afunc=self._apre_hook,
                                   name="memstore_pre_model_hook")
        self._post = RunnableLambda(self._post_hook, afunc=self._apost_hook,
                                    name="memstore_post_model_hook")

    @property
    def store(self) -> AnyStore:
        """The store the memory reads and writes."""
        return self._store

    @property
    def view(self) -> ContextView:
        """The view deciding what ``load`` and ``history`` return."""
        return self._view

    def conversation_id(self, config: RunnableConfig | None = None) -> str:
        """The memstore conversation of a run with ``config``.

        Raises:
            InvalidInputError: ``conversation_id`` is a function that found none in
                ``config``, or returned an id memstore cannot store.
        """
        if isinstance(self._conversation, str):
            return self._conversation
        return check_conversation(self._store, self._conversation(config or {}), _ALL,
                                  "conversation_id")

    def _sync(self, method: str) -> None:
        if isinstance(self._store, AsyncMemoryStore):
            raise ConfigurationError(
                f"MemstoreGraphMemory.{method} is synchronous but the store is an "
                f"AsyncMemoryStore: use a{method} (the hooks do under ainvoke/astream), "
                "or give a MemoryStore")

    # -- async (the implementation) --

    async def ahistory(self, config: RunnableConfig | None = None) -> list[BaseMessage]:
        """The view's window and the turn in progress, as LangChain messages.

        Raises:
            ContextBudgetError: a budgeted view cannot fit the anchored messages, the
                newest unit and the turn in progress.
        """
        cid = self.conversation_id(config)
        return from_memstore(await read_history(self._store, cid, self._view))

    async def asave(self, messages: Any, config: RunnableConfig | None = None
                    ) -> list[BaseMessage]:
        """Store those of ``messages`` (or of a state's) that are not stored yet.

        They are the messages after the last one the conversation already holds (same
        id, equal content) among its newest messages; a message without an id is never
        taken for a stored one. One transaction.

        Returns:
            The messages stored.

        Raises:
            InvalidInputError: not a state or list of LangChain messages, or a message
                memstore cannot store (``RemoveMessage``…); nothing is written.
        """
        wanted = _messages(messages)
        cid = self.conversation_id(config)
        new = wanted[await self._stored(cid, wanted):]
        converted = [to_memstore(m) for m in new]
        if converted:
            await run(self._store, lambda s: s.extend(cid, converted))
        return new

    async def aload(self, state: Any, config: RunnableConfig | None = None
                    ) -> list[BaseMessage]:
        """`asave()` the state's messages, then return `ahistory()`."""
        await self.asave(state, config)
        return await self.ahistory(config)

    async def aclear(self, config: RunnableConfig | None = None) -> None:
        """Delete every message of the conversation (a never-written one is a no-op)."""
        cid = self.conversation_id(config)
        with contextlib.suppress(ConversationNotFoundError):
            await run(self._store, lambda s: s.clear(cid))

    async def _stored(self, cid: str, wanted: list[BaseMessage]) -> int:
        """How many of ``wanted`` lead up to (and include) the last one already stored.

        Reads the conversation's newest messages, a page that grows until one of
        ``wanted`` is found or the page covers as many messages as ``wanted`` holds.
        """
        limit = min(len(wanted), _FIRST_PAGE)
        while limit:
            page = await _newest(self._store, cid, limit)
            stored: dict[str, list[BaseMessage]] = {}
            for message in from_memstore(page):
                if message.id is not None:
                    stored.setdefault(message.id, []).append(message)
            for index in range(len(wanted) - 1, -1, -1):
                message = wanted[index]
                if message.id is not None and message in stored.get(message.id, ()):
                    return index + 1
            if limit >= len(wanted) or len(page) < limit:
                break
            limit = min(len(wanted), limit * 4)
        return 0

    # -- sync --

    def history(self, config: RunnableConfig | None = None) -> list[BaseMessage]:
        """The view's window and the turn in progress (see `ahistory()`)."""
        self._sync("history")
        return _now(self.ahistory(config))

    def save(self, messages: Any, config: RunnableConfig | None = None) -> list[BaseMessage]:
        """Store those of ``messages`` (or of a state's) that are not stored yet."""
        self._sync("save")
        return _now(self.asave(messages, config))

    def load(self, state: Any, config: RunnableConfig | None = None) -> list[BaseMessage]:
        """Store the state's new messages, then return the history to send the model."""
        self._sync("load")
        return _now(self.aload(state, config))

    def clear(self, config: RunnableConfig | None = None) -> None:
        """Delete every message of the conversation (a never-written one is a no-op)."""
        self._sync("clear")
        _now(self.aclear(config))

    # -- create_react_agent's hooks --

    @property
    def pre_model_hook(self) -> RunnableLambda[Any, dict[str, Any]]:
        """``create_react_agent``'s ``pre_model_hook``: `load()` as ``llm_input_messages``.

        The model is given the history (the graph's state is left as it is).
        """
        return self._pre

    @property
    def post_model_hook(self) -> RunnableLambda[Any, dict[str, Any]]:
        """``create_react_agent``'s ``post_model_hook``: `save()` the model's reply."""
        return self._post

    def _pre_hook(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        return {"llm_input_messages": self.load(state, config)}

    async def _apre_hook(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        return {"llm_input_messages": await self.aload(state, config)}

    def _post_hook(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        self.save(state, config)
        return {}

    async def _apost_hook(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        await self.asave(state, config)
        return {}
