"""Pydantic AI integration: a persistent ``ConversationStore`` and a token-budgeted history.

Install with ``pip install 'memstore[pydantic-ai]'`` (Pydantic AI 2.x, which has
``pydantic_ai.conversation_store``)::

    from pydantic_ai import Agent
    from pydantic_ai.capabilities import ProcessHistory
    from pydantic_ai.conversation import Conversation
    from memstore import AsyncMemoryStore, TokenLimitedView
    from memstore.integrations.pydantic_ai import (
        MemstoreConversationStore, MemstoreHistoryProcessor)

    store = MemstoreConversationStore(AsyncMemoryStore("sqlite:///agents.db"))
    agent = Agent(model, capabilities=[
        ProcessHistory(MemstoreHistoryProcessor(TokenLimitedView(token_limit=8000)))])
    conversation = await store.load("chat-42") or Conversation(conversation_id="chat-42")
    result = await agent.run("Hello", conversation=conversation)
    await store.save(result)

Two pieces, usable apart:

* ``MemstoreConversationStore`` implements Pydantic AI's ``ConversationStore``
  primitives (``read_record``, ``read_records``, ``write_record``, ``delete_record``,
  ``read_entry``, and ``read_history`` in one query) over memstore, on SQLite and
  PostgreSQL. The base class keeps its own logic (what a save appends, where a
  rewritten history branches, what a fork shares, when ``ConversationConflict`` is
  raised).
* ``MemstoreHistoryProcessor`` is a history processor (Pydantic AI's
  ``ProcessHistory`` capability; ``Agent`` has no ``history_processors=`` argument in
  2.x): before each model request it keeps the messages a memstore view keeps, whole
  tool-call units only, never starting on a tool return.

How a conversation is stored. Each Pydantic AI conversation is the memstore
conversation with the same id, created with metadata ``{"pydantic_ai": true,
"scope": <scope>}`` (``scope`` left out when ``None``; the key is ``scope_key``), so
``store.list_conversations``, ``count_conversations`` and ``forget`` can select them by
scope. Its messages are, in seq order:

* **the current history** (the entries from the first to the record's head): each
  entry as its chat equivalent, which memstore counts and windows (see
  `chat_messages()`): a ``ModelResponse`` is one assistant message (its text, and one
  tool call per ``ToolCallPart``); a ``ModelRequest`` is one tool message per part that
  answers a call (tool returns, tool retries), then one system or user message per
  other part (system prompts; user prompts with their images; retry feedback). The
  entry itself (``id``, ``parent_id``, and the message as Pydantic AI's
  ``ModelMessagesTypeAdapter`` writes it, every part and field) rides in
  ``metadata["pydantic_ai"]`` of its first message, whose memstore id is the entry id
  (the others are ``<entry id>#1``, ``#2``...). ``store.window(id, view)`` is therefore a
  window of the conversation as the agent sees it;
* **entries off the current history** (the branches it left) as *hidden* messages:
  a tool message answering no stored call (``tool_call_id`` ``memstore.pydantic_ai``),
  which every memstore view leaves out (``incomplete_unit``), carrying the entry;
* **the record** (head, usage, deferred tool requests, scope, fork pointers, branches,
  revision, ``updated_at``) as the newest message, hidden the same way.

Every write is one ``store.rewrite`` of the newest messages, so the record and the
entries it adds are written together, and the revision is compared with the
conversation locked: a conflict leaves nothing behind.

Where this differs from ``InMemoryConversationStore``:

* **A fork copies the history it keeps** into its own memstore conversation (same
  entry ids, parents and messages), where the base class shares the entries. Entries
  read back equal; what differs is storage (a fork costs its history once) and
  erasure: deleting or forgetting a conversation deletes its own copies, never a
  fork's.
* **Deleting** a conversation deletes every message of it (its history, its
  branches and its record) in one transaction, but leaves the memstore conversation
  row, empty: deleting the row would be a second transaction, which could delete a
  conversation saved under the same id in between. ``store.delete_conversation(id)``
  or ``forget`` removes the row.
* **Finding an entry by id** (``read_entry``, ``read_history``) needs the conversation
  that holds it: memstore has no lookup of a message by id across conversations. The
  store remembers where the entries it has read or written are (every path of the
  base class reads the record first, which tells it), and otherwise searches the
  Pydantic AI conversations one by one (slow; only for an id it has never seen).
* **Messages read back** are what Pydantic AI's own ``ModelMessagesTypeAdapter``
  gives back, its serialized form: equal to what was saved, except where that adapter
  itself narrows a value, such as a ``BinaryContent`` holding an image, which comes
  back as its subclass ``BinaryImage``.
* **Writing to the memstore conversation by other means** (``store.append``) puts a
  message after the record: the conversation then reads as one this store does not
  have, and saving under its id raises ``ConversationConflict`` rather than writing
  over it.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
)

from memstore import (
    AsyncMemoryStore,
    ConfigurationError,
    ContextView,
    MemoryStore,
    Message,
    StoredMessage,
)
from memstore.errors import ConflictError, ConversationNotFoundError
from memstore.integrations._pydantic_ai_chat import (
    HIDDEN_CALL_ID,
    chat_messages,
    request_messages,
    response_message,
)
from memstore.tokens import TokenCounter

__all__ = [
    "HIDDEN_CALL_ID",
    "METADATA_KEY",
    "MemstoreConversationStore",
    "MemstoreHistoryProcessor",
    "chat_messages",
]

#: The message metadata key (and conversation metadata marker) of this integration.
METADATA_KEY = "pydantic_ai"
#: The memstore id of the message holding a conversation's record.
_RECORD_ID = "memstore.pydantic_ai.record"
#: Entry locations remembered (entry id -> memstore conversation, seq).
_LOCATIONS = 65_536
#: Messages read per page when walking a conversation newest-first.
_PAGE = 256

_RECORD_ADAPTER: TypeAdapter[ConversationRecord] = TypeAdapter(ConversationRecord)


# ---- entries and records as stored messages ---------------------------------------------------


def _dump_message(message: ModelMessage) -> str:
    return str(ModelMessagesTypeAdapter.dump_json([message]).decode())


def _load_message(text: str) -> ModelMessage:
    return ModelMessagesTypeAdapter.validate_json(text)[0]


def _hidden(message_id: str, data: dict[str, Any]) -> Message:
    return Message(role="tool", tool_call_id=HIDDEN_CALL_ID, content="", id=message_id,
                   metadata={METADATA_KEY: data})


def _entry_data(entry: ConversationEntry) -> dict[str, Any]:
    return {"entry": entry.id, "parent": entry.parent_id, "kind": entry.kind,
            "message": _dump_message(entry.message)}


def _live_messages(entry: ConversationEntry) -> list[Message]:
    """An entry on the current history: its chat messages, the entry on the first."""
    data = _entry_data(entry)
    chats = chat_messages(entry.message)
    if not chats:  # nothing to send: a hidden carrier keeps its place in the history
        return [_hidden(entry.id, {**data, "messages": 1})]
    data["messages"] = len(chats)
    out = [chats[0].model_copy(update={"id": entry.id, "metadata": {METADATA_KEY: data}})]
    for index, chat in enumerate(chats[1:], start=1):
        out.append(chat.model_copy(update={
            "id": f"{entry.id}#{index}", "metadata": {METADATA_KEY: {"entry": entry.id,
                                                                      "part": index}}}))
    return out


def _archived_message(entry: ConversationEntry) -> Message:
    """An entry off the current history (a branch it left): one hidden message."""
    return _hidden(entry.id, {**_entry_data(entry), "archived": True})


def _record_message(record: ConversationRecord) -> Message:
    return _hidden(_RECORD_ID, {"record": _RECORD_ADAPTER.dump_json(record).decode()})


def _data(message: StoredMessage) -> Mapping[str, Any]:
    data = message.metadata.get(METADATA_KEY)
    return data if isinstance(data, Mapping) else {}


def _record_of(message: StoredMessage) -> ConversationRecord | None:
    text = _data(message).get("record")
    if message.id != _RECORD_ID or not isinstance(text, str):
        return None
    return _RECORD_ADAPTER.validate_json(text)


def _entry_of(message: StoredMessage) -> ConversationEntry | None:
    data = _data(message)
    text = data.get("message")
    if not isinstance(text, str) or not isinstance(data.get("entry"), str):
        return None
    return ConversationEntry(id=data["entry"], parent_id=data.get("parent"),
                             message=_load_message(text), kind=data.get("kind", "message"))


def _is_archived(message: StoredMessage) -> bool:
    return bool(_data(message).get("archived"))


@dataclass
class _Layout:
    """One conversation as stored: its entries, which are current, and its record."""

    messages: list[StoredMessage]
    record: ConversationRecord | None
    entries: dict[str, ConversationEntry] = field(default_factory=dict)
    first_seq: dict[str, int] = field(default_factory=dict)
    archived: set[str] = field(default_factory=set)
    live: list[str] = field(default_factory=list)  # the current history's entry ids, in order

    @classmethod
    def of(cls, messages: Sequence[StoredMessage]) -> _Layout:
        record = _record_of(messages[-1]) if messages else None
        layout = cls(list(messages), record)
        for message in messages:
            entry = _entry_of(message)
            if entry is None:
                continue
            layout.entries[entry.id] = entry
            layout.first_seq[entry.id] = message.seq
            if _is_archived(message):
                layout.archived.add(entry.id)
            else:
                layout.live.append(entry.id)
        return layout

    def path(self, head: str | None) -> list[ConversationEntry] | None:
        """The entries from the first to ``head`` (``None``: an entry is missing)."""
        return _path(self.entries, head)


def _path(entries: Mapping[str, ConversationEntry],
          head: str | None) -> list[ConversationEntry] | None:
    """The entries from the first to ``head`` in ``entries`` (``None``: one is missing)."""
    chain: list[ConversationEntry] = []
    seen: set[str] = set()
    while head is not None:
        entry = entries.get(head)
        if entry is None or head in seen:
            return None
        seen.add(head)
        chain.append(entry)
        head = entry.parent_id
    chain.reverse()
    return chain


# ---- the store ----------------------------------------------------------------------------------


class _Relayout(Exception):
    """Raised inside a rewrite: the write moves the head, so it needs the whole layout."""


def _conflict(conversation_id: str) -> ConversationConflict:
    return ConversationConflict(conversation_id)


class MemstoreConversationStore(ConversationStore):
    """Pydantic AI's ``ConversationStore`` over memstore (SQLite or PostgreSQL).

    Load and save conversations around each run, as with any ``ConversationStore``::

        conversation = await store.load(conversation_id) or Conversation(
            conversation_id=conversation_id)
        result = await agent.run(prompt, conversation=conversation)
        await store.save(result)

    Each conversation is the memstore conversation of the same id (see the module
    doc): its current history as chat messages that views window, the branches it left
    and its record as hidden messages. ``read_history(head, limit=n)`` reads the newest
    messages of that conversation, one query for the usual case (a head that is the
    current one, ``n`` entries in one page), more only past the branches stored among
    them.

    Args:
        store: a [`MemoryStore`][memstore.MemoryStore] (its calls run in a worker thread) or an
            [`AsyncMemoryStore`][memstore.AsyncMemoryStore].
        scope_key: the conversation metadata key that holds a conversation's scope
            (``where={scope_key: scope}`` selects them in memstore).

    Raises:
        ConfigurationError: ``store`` is not a memstore store, or ``scope_key`` is not a
            non-empty string other than ``"pydantic_ai"``.
    """

    def __init__(self, store: MemoryStore | AsyncMemoryStore, *, scope_key: str = "scope") -> None:
        if not isinstance(store, (MemoryStore, AsyncMemoryStore)):
            raise ConfigurationError(
                "MemstoreConversationStore needs a memstore MemoryStore or AsyncMemoryStore, "
                f"not {type(store).__name__}")
        if not isinstance(scope_key, str) or not scope_key or scope_key == METADATA_KEY:
            raise ConfigurationError(
                f"scope_key must be a non-empty string other than {METADATA_KEY!r}, "
                f"got {scope_key!r}")
        self.store = store
        self.scope_key = scope_key
        self._where: OrderedDict[str, tuple[str, int | None]] = OrderedDict()

    # ---- running store calls -----------------------------------------------------------

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method: Callable[..., Any] = getattr(self.store, name)
        if isinstance(self.store, AsyncMemoryStore):
            return await method(*args, **kwargs)
        return await asyncio.to_thread(method, *args, **kwargs)

    async def _rewrite(self, conversation_id: str, fn: Callable[[list[StoredMessage]], Any],
                       newest: int | None) -> None:
        try:
            await self._call("rewrite", conversation_id, fn, newest=newest)
        except ConversationNotFoundError:
            raise _conflict(conversation_id) from None

    def _remember(self, entry_id: str | None, conversation_id: str, seq: int | None) -> None:
        if entry_id is None:
            return
        self._where[entry_id] = (conversation_id, seq)
        self._where.move_to_end(entry_id)
        while len(self._where) > _LOCATIONS:
            self._where.popitem(last=False)

    def _remember_record(self, record: ConversationRecord) -> None:
        """The record's conversation holds its head, branch tips and fork point."""
        for entry_id in {record.head_id, record.forked_at, *record.branches}:
            if entry_id is None:
                continue
            known = self._where.get(entry_id)
            seq = known[1] if known is not None and known[0] == record.conversation_id else None
            self._remember(entry_id, record.conversation_id, seq)

    def _remember_layout(self, conversation_id: str, layout: _Layout) -> None:
        for entry_id, seq in layout.first_seq.items():
            self._remember(entry_id, conversation_id, seq)

    async def _newest(self, conversation_id: str, limit: int,
                      stop: int | None = None) -> list[StoredMessage]:
        page: list[StoredMessage] = await self._call(
            "messages", conversation_id, stop=stop, limit=limit, newest_first=True)
        return page

    async def _layout(self, conversation_id: str) -> _Layout:
        """The whole conversation, read in one snapshot."""
        messages: list[StoredMessage] = await self._call("messages", conversation_id)
        layout = _Layout.of(messages)
        self._remember_layout(conversation_id, layout)
        return layout

    # ---- records ------------------------------------------------------------------------

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        """The conversation's record (its newest message), or ``None``: one query."""
        newest = await self._newest(conversation_id, 1)
        record = _record_of(newest[0]) if newest else None
        if record is None or record.conversation_id != conversation_id:
            return None
        self._remember_record(record)
        return record

    async def _conversation_ids(self, scope: str | None) -> list[str]:
        """The ids of the memstore conversations this integration created (and ``scope``'s)."""
        where: dict[str, Any] = {METADATA_KEY: True}
        if scope is not None:
            where[self.scope_key] = scope
        parameters = inspect.signature(self.store.list_conversations).parameters
        filtered = "where" in parameters
        kwargs: dict[str, Any] = {"where": where} if filtered else {}
        ids: list[str] = []
        after: str | None = None
        while True:  # pages by id ("after"); without a metadata filter: every conversation
            page = await self._call("list_conversations", limit=_PAGE, after=after, **kwargs)
            ids.extend(c.id for c in page
                       if filtered or all(c.metadata.get(k) == v for k, v in where.items()))
            if len(page) < _PAGE:
                return ids
            after = page[-1].id

    async def read_records(self, *, scope: str | None = None,
                           limit: int | None = None) -> Sequence[ConversationRecord]:
        """The records (of ``scope``), newest ``updated_at`` first, at most ``limit``.

        Lists the conversations by their metadata (an index lookup where memstore has
        ``where=``), then reads each one's record (one query each). With ``limit`` and a
        memstore that lists by recency, it reads the most recently written
        conversations first and stops after ``limit`` records: O(limit).
        """
        parameters = inspect.signature(self.store.list_conversations).parameters
        if limit is not None and "where" in parameters and "order" in parameters:
            return await self._newest_records(scope, limit)
        records = []
        for conversation_id in await self._conversation_ids(scope):
            record = await self.read_record(conversation_id)
            if record is not None and (scope is None or record.scope == scope):
                records.append(record)
        records.sort(key=lambda record: record.updated_at, reverse=True)
        return records[:limit]

    async def _newest_records(self, scope: str | None, limit: int) -> list[ConversationRecord]:
        where: dict[str, Any] = {METADATA_KEY: True}
        if scope is not None:
            where[self.scope_key] = scope
        records: list[ConversationRecord] = []
        size = min(_PAGE, limit + 1)
        after: Any = None
        while len(records) < limit:
            page = await self._call("list_conversations", limit=size, after=after,
                                    where=where, order="updated")
            for conversation in page:
                record = await self.read_record(conversation.id)
                if record is not None and (scope is None or record.scope == scope):
                    records.append(record)
            if len(page) < size:
                break
            after = page[-1]
        records.sort(key=lambda record: record.updated_at, reverse=True)
        return records[:limit]

    # ---- writing ------------------------------------------------------------------------

    async def write_record(self, record: ConversationRecord, *,
                           new_entries: Sequence[ConversationEntry] = (),
                           expected_revision: str | None) -> None:
        """Store ``record`` and the entries it adds, if the stored revision is the expected one.

        One transaction (a ``store.rewrite`` of the newest messages, the conversation
        locked): the revision is compared, the new entries are stored and the record is
        replaced together, or nothing is written. A save that continues the current
        history rewrites only the record's message; one that moves the head (a branch,
        a rewritten history) first reads the conversation, then rewrites it from where
        the old and new histories part, checking the revision again as it writes.

        Raises:
            ConversationConflict: the stored revision is not ``expected_revision`` (a
                record exists when it is ``None``), or ``record.head_id`` names an entry
                that neither the store nor ``new_entries`` has.
        """
        entries = list(new_entries)
        conversation_id = record.conversation_id
        if expected_revision is None:
            await self._create(record, entries)
        else:
            try:
                await self._append(record, entries, expected_revision)
            except _Relayout:
                await self._relayout(record, entries, expected_revision)
        for entry in entries:
            self._remember(entry.id, conversation_id, None)
        self._remember_record(record)

    def _check_record(self, newest: list[StoredMessage], conversation_id: str,
                      expected: str) -> ConversationRecord:
        current = _record_of(newest[-1]) if newest else None
        if current is None or current.conversation_id != conversation_id \
                or current.revision != expected:
            raise _conflict(conversation_id)
        return current

    async def _append(self, record: ConversationRecord, entries: list[ConversationEntry],
                      expected: str) -> None:
        """The usual save: new entries after the current head (or only the record changes)."""
        conversation_id = record.conversation_id

        def write(newest: list[StoredMessage]) -> list[Message]:
            current = self._check_record(newest, conversation_id, expected)
            continues = (entries[0].parent_id == current.head_id
                         and record.head_id == entries[-1].id) if entries \
                else record.head_id == current.head_id
            if not continues:
                raise _Relayout
            return [*(m for entry in entries for m in _live_messages(entry)),
                    _record_message(record)]

        await self._rewrite(conversation_id, write, newest=1)

    async def _relayout(self, record: ConversationRecord, entries: list[ConversationEntry],
                        expected: str) -> None:
        """A write that moves the head: the current history becomes the new one.

        Reads the conversation, then rewrites it from the first message where the old
        and the new current histories part: what the new one does not hold becomes
        hidden (in its order), then the new history's entries from there on. The
        rewrite checks the revision and that the messages are the ones read.
        """
        conversation_id = record.conversation_id
        layout = await self._layout(conversation_id)
        if layout.record is None or layout.record.revision != expected:
            raise _conflict(conversation_id)
        known = {**layout.entries, **{e.id: e for e in entries}}
        target = _path(known, record.head_id)
        if target is None:
            raise _conflict(conversation_id)
        target_ids = [e.id for e in target]
        shared = 0
        while (shared < len(target_ids) and shared < len(layout.live)
               and target_ids[shared] == layout.live[shared]):
            shared += 1
        moved = [*layout.live[shared:], *target_ids[shared:]]
        seqs = [layout.first_seq[entry_id] for entry_id in moved if entry_id in layout.first_seq]
        start = min(seqs) if seqs else layout.messages[-1].seq
        read_ids = [m.id for m in layout.messages if m.seq >= start]
        on_target = set(target_ids)

        def write(newest: list[StoredMessage]) -> list[Message | StoredMessage]:
            self._check_record(newest, conversation_id, expected)
            if [m.id for m in newest] != read_ids:
                raise _conflict(conversation_id)
            out: list[Message | StoredMessage] = []
            current: dict[str, list[StoredMessage]] = {}  # entries in range that stay current
            owner: str | None = None
            for message in newest[:-1]:
                entry = _entry_of(message)
                if entry is not None:
                    owner = entry.id
                    if entry.id not in on_target:  # left: hidden, in its order
                        out.append(message if _is_archived(message)
                                   else _archived_message(entry))
                        continue
                    if _is_archived(message):
                        continue  # comes back as current below
                if owner is not None and owner in on_target and not _is_archived(message):
                    current.setdefault(owner, []).append(message)
            out.extend(_archived_message(e) for e in entries if e.id not in on_target)
            for entry in target:  # the new history from the first entry in range, in order
                if entry.id in current:
                    out.extend(current[entry.id])  # already current: kept as stored
                elif layout.first_seq.get(entry.id, start) >= start:
                    out.extend(_live_messages(entry))
            out.append(_record_message(record))
            return out

        await self._rewrite(conversation_id, write, newest=len(read_ids))

    async def _create(self, record: ConversationRecord,
                      entries: list[ConversationEntry]) -> None:
        """A new conversation: its history (a fork's, copied), its entries, its record."""
        conversation_id = record.conversation_id
        new = {e.id: e for e in entries}
        base = record.head_id
        while base is not None and base in new:
            base = new[base].parent_id
        history: list[ConversationEntry] = []
        if base is not None:
            try:
                history = await self.read_history(base)
            except LookupError:
                raise _conflict(conversation_id) from None
        target = _path({**{e.id: e for e in history}, **new}, record.head_id)
        if target is None:
            raise _conflict(conversation_id)
        on_target = {e.id for e in target}
        metadata: dict[str, Any] = {METADATA_KEY: True}
        if record.scope is not None:
            metadata[self.scope_key] = record.scope
        adopted = False
        try:
            await self._call("create_conversation", conversation_id, metadata)
        except ConflictError:
            adopted = True  # the row exists: empty (deleted before), or not ours (refused below)

        def write(newest: list[StoredMessage]) -> list[Message]:
            if newest:  # a record, or messages written by other means
                raise _conflict(conversation_id)
            return [*(_archived_message(e) for e in entries if e.id not in on_target),
                    *(m for entry in target for m in _live_messages(entry)),
                    _record_message(record)]

        await self._rewrite(conversation_id, write, newest=1)
        if adopted:
            await self._index_scope(conversation_id, metadata)

    async def _index_scope(self, conversation_id: str, metadata: dict[str, Any]) -> None:
        """Bring a reused conversation row's metadata in line with the new record's scope.

        Needs ``update_conversation`` (newer memstore); without it the row keeps the
        metadata it was created with.
        """
        update = getattr(self.store, "update_conversation", None)
        if update is None:
            return
        conversation = await self._call("get_conversation", conversation_id)
        wanted = {METADATA_KEY: True, self.scope_key: metadata.get(self.scope_key)}
        if all(conversation.metadata.get(k) == v for k, v in wanted.items()):
            return
        await self._call("update_conversation", conversation_id, metadata=wanted, merge=True)

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        """Delete the conversation's messages (history, branches, record), one transaction.

        The memstore conversation row stays, empty (see the module doc).

        Raises:
            ConversationConflict: no record with ``expected_revision`` is stored.
        """

        def clear(messages: list[StoredMessage]) -> list[Message]:
            self._check_record(messages, conversation_id, expected_revision)
            return []

        await self._rewrite(conversation_id, clear, newest=None)

    # ---- entries ------------------------------------------------------------------------

    async def _locate(self, entry_id: str, *, search: bool = False) -> str:
        """The memstore conversation holding ``entry_id``; KeyError when none does.

        Where the store last saw it, unless ``search``: then (and for an id it never
        saw) every Pydantic AI conversation is read until one holds it.
        """
        known = self._where.get(entry_id)
        if known is not None and not search:
            return known[0]
        self._where.pop(entry_id, None)
        for conversation_id in await self._conversation_ids(None):
            layout = await self._layout(conversation_id)
            if entry_id in layout.entries:
                return conversation_id
        raise KeyError(entry_id)

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        """The entry with this id.

        Raises:
            KeyError: no conversation of this store holds it.
        """
        conversation_id = await self._locate(entry_id)
        seq = self._where.get(entry_id, (conversation_id, None))[1]
        if seq is not None:
            try:
                message = await self._call("get_message", conversation_id, seq)
            except LookupError:
                message = None
            entry = _entry_of(message) if message is not None else None
            if entry is not None and entry.id == entry_id:
                return entry
        layout = await self._layout(conversation_id)
        if entry_id not in layout.entries:  # no longer there (deleted): look everywhere
            layout = await self._layout(await self._locate(entry_id, search=True))
        return layout.entries[entry_id]

    async def read_history(self, head_id: str | None, *,
                           limit: int | None = None) -> list[ConversationEntry]:
        """The entries from the first to ``head_id``, or the last ``limit`` of them.

        For the conversation's current head: its newest messages, newest first, one
        query when the ``limit`` entries are in the first page (more pages only when
        the branches it left are stored among them). Any other head (a branch it
        left) reads the conversation once.

        Raises:
            KeyError: no conversation of this store holds ``head_id``.
        """
        if head_id is None or limit == 0:
            return []
        conversation_id = await self._locate(head_id)
        if limit is not None:
            found = await self._newest_history(conversation_id, head_id, limit)
            if found is not None:
                return found
        layout = await self._layout(conversation_id)
        path = layout.path(head_id)
        if path is None:  # no longer there (deleted): look everywhere
            layout = await self._layout(await self._locate(head_id, search=True))
            path = layout.path(head_id)
            if path is None:
                raise KeyError(head_id)
        return path if limit is None else path[-limit:]

    async def _newest_history(self, conversation_id: str, head_id: str,
                              limit: int) -> list[ConversationEntry] | None:
        """The last ``limit`` entries up to the current head, newest first; ``None``: not it."""
        size = min(_PAGE, 2 * limit + 2)
        stop: int | None = None
        found: list[ConversationEntry] = []
        checked = False
        while True:
            page = await self._newest(conversation_id, size, stop)
            for message in page:
                if not checked:
                    checked = True
                    record = _record_of(message)
                    if record is None or record.head_id != head_id:
                        return None
                    continue
                entry = _entry_of(message)
                if entry is None or _is_archived(message):
                    continue
                self._remember(entry.id, conversation_id, message.seq)
                if found and found[-1].parent_id != entry.id:
                    return None  # not laid out as written: read it whole
                found.append(entry)
                if len(found) == limit:
                    break
            if len(found) == limit or len(page) < size:
                break
            stop = page[-1].seq
            size = _PAGE
        if not found or found[0].id != head_id:
            return None
        if len(found) < limit and found[-1].parent_id is not None:
            return None  # the whole conversation was read, but not the whole history
        found.reverse()
        return found


# ---- the history processor -------------------------------------------------------------------


@dataclass
class _Counted:
    message: weakref.ref[Any]
    chats: list[tuple[int, Message]]
    tokens: list[int]


class MemstoreHistoryProcessor:
    """A Pydantic AI history processor that sends a memstore view's window.

    Give it to an agent as ``ProcessHistory(MemstoreHistoryProcessor(view))`` (in
    ``capabilities=``). Before each model request it maps the messages to their chat
    equivalent (`chat_messages()`), runs ``view`` over them, and returns the messages the
    window keeps: whole tool-call units (a response with tool calls and the returns
    that answer them are kept or dropped together), never a tool return whose call was
    left out, system prompts always (they are anchored), and the newest message. A
    request some of whose parts were left out comes back as a copy with the kept parts
    (and every part with no chat equivalent); a request or response of which nothing is
    kept is left out.

    Each message's count is computed once per message object (Pydantic AI passes the
    same objects to every request of a run), with the view's counter, else
    ``counter``, else the [`TiktokenCounter`][memstore.TiktokenCounter] default.

    Args:
        view: a memstore view (a budgeted one, such as
            [`TokenLimitedView`][memstore.TokenLimitedView], bounds the tokens sent).
        counter: the token counter when the view names none (a store's ``counter``, so
            counts match what the store holds).

    Raises:
        ConfigurationError: ``view`` is not a memstore view.
    """

    def __init__(self, view: ContextView, *, counter: TokenCounter | None = None) -> None:
        if not isinstance(view, ContextView):
            raise ConfigurationError("MemstoreHistoryProcessor: view must be a memstore view, "
                                     f"not {type(view).__name__}")
        self.view = view
        if counter is None:
            from memstore import TiktokenCounter

            counter = TiktokenCounter()
        self.counter = view.resolve_counter(counter)
        self._counted: dict[int, _Counted] = {}

    def _count(self, message: ModelMessage) -> _Counted:
        key = id(message)
        known = self._counted.get(key)
        if known is not None and known.message() is message:
            return known
        if isinstance(message, ModelResponse):
            chats = [(0, response_message(message))]
        else:
            chats = request_messages(message)
        counted = _Counted(weakref.ref(message), chats,
                           [self.counter.count_message(chat) for _, chat in chats])
        if len(self._counted) > 4 * _LOCATIONS:
            self._counted = {k: v for k, v in self._counted.items() if v.message() is not None}
        self._counted[key] = counted
        return counted

    def __call__(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        """The messages the view keeps (a new list; kept messages are the same objects).

        Raises:
            ContextBudgetError: a budgeted view cannot fit the system prompts and the
                newest unit.
        """
        if not messages:
            return []
        stored: list[StoredMessage] = []
        owner: list[tuple[int, int]] = []  # per stored message: (message index, part index)
        now = datetime.now(timezone.utc)
        for index, message in enumerate(messages):
            counted = self._count(message)
            when = getattr(message, "timestamp", None) or now
            for (part, chat), tokens in zip(counted.chats, counted.tokens):
                stored.append(StoredMessage.model_validate({
                    **{name: getattr(chat, name) for name in Message.model_fields},
                    "id": f"{index}.{part}", "conversation_id": "pydantic-ai",
                    "seq": len(stored) + 1, "created_at": when, "token_count": tokens,
                    "token_counter": self.counter.name}))
                owner.append((index, part))
        window = self.view.apply(stored, self.counter)
        kept: dict[int, set[int]] = {}
        for chat in window.messages:
            if isinstance(chat, StoredMessage):
                index, part = owner[chat.seq - 1]
                kept.setdefault(index, set()).add(part)
        return _kept_messages(messages, kept, {index for index, _ in owner})


def _kept_messages(messages: list[ModelMessage], kept: dict[int, set[int]],
                   mapped: set[int]) -> list[ModelMessage]:
    """The kept messages; a message with no chat equivalent goes with the one after it."""
    out: list[ModelMessage] = []
    follow = True  # the newest message is always sent
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if index not in mapped:
            if follow:
                out.append(message)
            continue
        parts = kept.get(index)
        follow = parts is not None
        if parts is None:
            continue
        if isinstance(message, ModelRequest):
            chat_parts = {part for part, _ in request_messages(message)}
            if not chat_parts <= parts:
                message = _with_parts(message, [
                    p for i, p in enumerate(message.parts) if i in parts or i not in chat_parts])
        out.append(message)
    out.reverse()
    return out


def _with_parts(request: ModelRequest, parts: Iterable[Any]) -> ModelRequest:
    from dataclasses import replace

    return replace(request, parts=list(parts))
