"""A process-local cache of decoded message rows, validated by the conversation epoch.

An agent reads a window, appends a message or two, and reads the next window: the
rows of consecutive windows are almost all the same. Decoding a row into a
[`StoredMessage`][memstore.StoredMessage] costs more than reading it, so each store
keeps the rows its windows decoded, per conversation, and the next window reads
from the database only the rows it does not hold (usually just the new ones).

Why a cached row can be trusted: stored messages change only by appending, or by
an operation that also replaces the conversation's ``epoch`` in the same
transaction (``set_score``, ``pin``/``unpin``, ``pop``, ``truncate``, ``clear``, a
replacing ``load_state``, a ``rewrite`` that changes a stored row; a conversation
created again gets a new random epoch). A ``rewrite`` that only adds messages after
the ones it read changes no stored row and leaves the epoch alone, as an append does.
Every window reads the conversation row first, in the same snapshot as the
messages; a cache entry is used only when its epoch equals the one read, and then
each cached row with a seq inside the snapshot's ``[first_seq, last_seq]`` is the
row the database holds. Rows are never cached from a write transaction, so nothing
uncommitted is ever cached.

What memstore cannot see: an UPDATE or DELETE run on its tables by hand, outside
memstore, that leaves ``epoch`` alone. Such a change must also set
``memstore_conversations.epoch`` to a new value (any value it never had), or the
application must call ``store.clear_cache()``. Epoch 0, the value of conversations
written before migration 0002, is never trusted (see ``memstore._db.window.UNTRUSTED_EPOCH``).

Stored summaries are not message rows: they are never cached, and ``summarize``
leaves the epoch alone (it changes no message). Operations that delete summaries
(``pop``, ``clear``, a replacing ``load_state``, a ``rewrite``) replace the epoch anyway, so a
window's summary read carries the same epoch check as its range reads.

Windows share the cached models: they are frozen, and their ``metadata``,
``content`` parts and ``tool_calls`` are read-only containers (`memstore._db.readonly`),
so no caller can change what a later window reads.

The cache is bounded by a number of messages (the store's ``cache_size``); the
least recently used conversations go first. Entries are never mutated once stored
(a reader that adds rows stores a new dict), so readers in several threads share
them under one short lock.

**Admission.** While the cache has room, every window's rows are kept. Once it is
full, a conversation that is not cached gets in only when this store used it lately:
a write through the store (``append``, ``extend``) or an earlier window that was
turned away, among the last ``max(64, conversations cached)`` conversations turned away
(an evicted conversation starts over: its next window is turned away). An agent appends and reads
the same conversation again and again, so its rows get in at once. A service reading
thousands of conversations in no particular order would otherwise evict, on every
window, rows that were about to be used for rows that will not be read again; that
churn cost more than the cache saved (windows 14 % slower than with ``cache_size=0``
over 2,000 conversations, most of it the garbage collector walking the cached models
that kept replacing each other).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

from memstore._db.fork import after_fork_in_child
from memstore.models import StoredMessage

__all__ = ["DEFAULT_CACHE_SIZE", "CacheEntry", "CacheInfo", "RowCache"]

DEFAULT_CACHE_SIZE = 10_000
"""Messages a store keeps decoded by default (a few megabytes for typical messages)."""

#: Fewest recently used conversations a full cache remembers for admission.
MIN_RECENT = 64


class CacheEntry(NamedTuple):
    """Decoded rows of one conversation, valid while its epoch is ``epoch``."""

    epoch: int
    rows: dict[int, StoredMessage]
    #: The newest seq in ``rows`` (0 when empty).
    last_seq: int = 0


class CacheInfo(NamedTuple):
    """Statistics of a store's row cache (``store.cache_info()``).

    Attributes:
        hits: message rows windows took from the cache.
        misses: message rows windows read and decoded from the database.
        size: messages held now.
        max_size: the store's ``cache_size`` (0: the cache is disabled).
        conversations: conversations with rows held now.
    """

    hits: int
    misses: int
    size: int
    max_size: int
    conversations: int


class RowCache:
    """Decoded rows per conversation, least recently used first out.

    Args:
        max_messages: the most messages held over all conversations (>= 1).
    """

    def __init__(self, max_messages: int) -> None:
        self.max_messages = max_messages
        self._entries: OrderedDict[str, CacheEntry] = OrderedDict()
        # Conversations used lately that are not cached (ids only), oldest first.
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._size = 0
        self._hits = 0
        self._misses = 0
        self._lock = threading.Lock()
        # A lock another thread held at fork would stay held in the child forever.
        after_fork_in_child(self, _new_lock)

    def __len__(self) -> int:
        """Messages held."""
        return self._size

    def get(self, conversation_id: str) -> CacheEntry | None:
        """The entry of a conversation (marks it recently used), or ``None``."""
        with self._lock:
            entry = self._entries.get(conversation_id)
            if entry is not None:
                self._entries.move_to_end(conversation_id)
            return entry

    def note(self, conversation_id: str) -> None:
        """Remember that this store used a conversation (a write): it is admitted."""
        with self._lock:
            if conversation_id not in self._entries:
                self._note(conversation_id)

    def _note(self, conversation_id: str) -> None:
        recent = self._recent
        if conversation_id in recent:
            recent.move_to_end(conversation_id)
            return
        recent[conversation_id] = None
        limit = max(MIN_RECENT, len(self._entries))
        while len(recent) > limit:
            recent.popitem(last=False)

    def put(self, conversation_id: str, epoch: int, rows: dict[int, StoredMessage],
            last_seq: int | None = None) -> None:
        """Store ``rows`` (not mutated afterwards) as the conversation's entry.

        ``last_seq`` is the newest seq in ``rows`` when the caller knows it (computed
        here otherwise).

        An entry larger than the whole cache keeps its anchored messages and the
        newest others (windows read newest-first). A conversation that is not cached
        yet is admitted while there is room, or when it was used lately (see the
        module's docstring); otherwise it is only remembered as used.
        """
        if len(rows) > self.max_messages:
            rows = _newest(rows, self.max_messages)
            last_seq = None  # (many anchored rows can crowd out the newest one)
        if last_seq is None:
            last_seq = max(rows, default=0)
        with self._lock:
            old = self._entries.pop(conversation_id, None)
            if old is not None:
                self._size -= len(old.rows)
            elif (self._size + len(rows) > self.max_messages
                  and conversation_id not in self._recent):
                self._note(conversation_id)  # full, and not used lately: not yet
                return
            else:
                self._recent.pop(conversation_id, None)
            self._entries[conversation_id] = CacheEntry(epoch, rows, last_seq)
            self._size += len(rows)
            while self._size > self.max_messages and len(self._entries) > 1:
                _, evicted = self._entries.popitem(last=False)
                self._size -= len(evicted.rows)

    def record(self, hits: int, misses: int) -> None:
        """Count one window's rows taken from the cache and read from the database."""
        with self._lock:
            self._hits += hits
            self._misses += misses

    def info(self) -> CacheInfo:
        """Current statistics."""
        with self._lock:
            return CacheInfo(self._hits, self._misses, self._size, self.max_messages,
                             len(self._entries))

    def discard(self, conversation_id: str) -> None:
        """Forget one conversation."""
        with self._lock:
            old = self._entries.pop(conversation_id, None)
            if old is not None:
                self._size -= len(old.rows)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._entries.clear()
            self._recent.clear()
            self._size = 0
            self._hits = 0
            self._misses = 0


def _newest(rows: dict[int, StoredMessage], limit: int) -> dict[int, StoredMessage]:
    """At most ``limit`` rows: the (newest) anchored ones, then the newest others."""
    anchored = sorted(s for s, m in rows.items() if m.anchored)[-limit:]
    room = limit - len(anchored)
    others = sorted(s for s, m in rows.items() if not m.anchored)
    keep = anchored + (others[-room:] if room > 0 else [])
    return {s: rows[s] for s in sorted(keep)}


def _new_lock(cache: RowCache) -> None:
    """In a forked child: a fresh lock for the cache (the inherited one may be held)."""
    cache._lock = threading.Lock()
