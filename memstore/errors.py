"""The memstore error tree, and the one place where database errors are translated.

Every error memstore raises on purpose derives from `MemstoreError`::

    MemstoreError
    ├── ConfigurationError (ValueError)         bad store/view/counter configuration
    │   └── MissingDependencyError (ImportError) an optional package is not installed
    ├── InvalidInputError (ValueError)          a call argument is invalid; nothing was written
    ├── NotFoundError (LookupError)
    │   ├── ConversationNotFoundError
    │   ├── MessageNotFoundError
    │   └── DatabaseNotFoundError               the SQLite file is missing (migrate="check"/"off")
    ├── ConflictError                           idempotency key reused with other content, or
    │                                           a conversation id that already exists
    ├── ContextBudgetError                      anchored messages + newest unit exceed a budget
    ├── TokenizerUnavailableError               an encoding cannot be loaded (offline)
    ├── SchemaOutOfDateError                    the database schema is not at memstore's head
    ├── SchemaTooNewError                       the database was migrated by a newer memstore
    └── DatabaseError                           any other driver/SQLAlchemy failure
        └── TransientError                      retryable: the same call may succeed again
            ├── ConnectionLostError             the connection broke (restart, terminated backend)
            └── DatabaseBusyError               lock timeout / serialization failure

    InvalidInputError
    └── ImportFormatError                       a bad line in an export file (``.line``)

Invalid *model* input (a message with an unknown role, a tool message without
``tool_call_id`` …) raises `pydantic.ValidationError` from the model
constructors, before any database work starts.

SQLAlchemy and driver exceptions are converted only by `translate_db_errors()`,
always chained (``raise ... from exc``) so the original stays visible.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import exc as sa_exc

__all__ = [
    "ConfigurationError",
    "ConflictError",
    "ConnectionLostError",
    "ContextBudgetError",
    "ConversationNotFoundError",
    "DatabaseBusyError",
    "DatabaseError",
    "DatabaseNotFoundError",
    "ImportFormatError",
    "InvalidInputError",
    "MemstoreError",
    "MessageNotFoundError",
    "MissingDependencyError",
    "NotFoundError",
    "ReadOnlyError",
    "SchemaOutOfDateError",
    "SchemaTooNewError",
    "StoreClosedError",
    "TokenizerUnavailableError",
    "TransientError",
    "translate_db_errors",
]


class MemstoreError(Exception):
    """Root of every error memstore raises on purpose."""


class ConfigurationError(MemstoreError, ValueError):
    """A store, view or counter was configured with values that cannot work."""


class MissingDependencyError(ConfigurationError, ImportError):
    """An optional dependency needed for the requested feature is not installed."""


class InvalidInputError(MemstoreError, ValueError):
    """A call argument is invalid. Nothing was written."""


class NotFoundError(MemstoreError, LookupError):
    """The requested conversation or message does not exist."""


class ConversationNotFoundError(NotFoundError):
    """No conversation has the given id."""

    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"conversation {conversation_id!r} does not exist")
        self.conversation_id = conversation_id


class MessageNotFoundError(NotFoundError):
    """The conversation has no message with the given seq."""

    def __init__(self, conversation_id: str, seq: int) -> None:
        super().__init__(f"conversation {conversation_id!r} has no message with seq {seq}")
        self.conversation_id = conversation_id
        self.seq = seq


class StoreClosedError(MemstoreError):
    """The store was closed: its methods refuse to run (open a new store to go on)."""


class ConflictError(MemstoreError):
    """A write conflicts with what is stored (idempotency key reuse, duplicate id)."""


class ReadOnlyError(MemstoreError, TypeError):
    """A read-only container was changed: the nested values of a message read from a store.

    A store's row cache shares the messages it returns between windows, so their
    ``metadata``, ``content`` parts and ``tool_calls`` refuse changes (the models
    themselves are frozen). Change a copy: ``dict(m.metadata)``, ``list(m.tool_calls)``,
    or ``m.model_copy(deep=True)``, whose containers are plain ones.
    """


class ContextBudgetError(MemstoreError):
    """The messages a view must keep do not fit in its token budget.

    Attributes:
        required: tokens needed by the anchored messages, the newest complete unit,
            reply priming and ``reserve``.
        budget: the view's token limit.
    """

    def __init__(self, message: str, *, required: int, budget: int) -> None:
        super().__init__(message)
        self.required = required
        self.budget = budget


class TokenizerUnavailableError(MemstoreError):
    """A tokenizer encoding cannot be loaded (typically: no network and no local copy)."""


class SchemaOutOfDateError(MemstoreError):
    """The database schema is not at the revision this version of memstore needs."""


class DatabaseError(MemstoreError):
    """A database operation failed for a reason memstore does not model more precisely."""


# ---- storage reliability: schema versions, missing databases, retryable faults ----------


class SchemaTooNewError(MemstoreError):
    """The database was migrated by a newer memstore: this version must not write to it.

    Not a `SchemaOutOfDateError` (whose remedy, ``memstore db upgrade``, cannot
    help here): upgrade the memstore package instead.

    Attributes:
        revision: the unknown revision(s) the database is stamped with.
    """

    def __init__(self, revision: str) -> None:
        super().__init__(
            f"the database was migrated by a newer memstore (schema revision {revision}, "
            "which this version does not know); upgrade the memstore package to use it"
        )
        self.revision = revision


class DatabaseNotFoundError(NotFoundError):
    """The SQLite database file does not exist (and the store was told not to create it).

    Attributes:
        path: the missing file.
    """

    def __init__(self, path: str) -> None:
        super().__init__(
            f"the database file {path!r} does not exist (migrate='check' and 'off' never "
            "create one; use migrate='auto' or `memstore db upgrade` to create it)"
        )
        self.path = path


class ImportFormatError(InvalidInputError):
    """A line of an export file is not valid; that line's conversation was not written.

    Attributes:
        line: the 1-based number of the offending line.
        imported: what was imported before it (conversations earlier in the file).
    """

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.imported: list[Any] = []


class TransientError(DatabaseError):
    """A failure that may go away on retry: the same call can simply be made again.

    Nothing of the failed call was committed, and a retry with the same client
    message ids is exactly-once (a message that did commit is recognised by its id).
    """


class ConnectionLostError(TransientError):
    """The connection broke or could not be made (restart, server down, network)."""


class DatabaseBusyError(TransientError):
    """The database stayed locked, or a transaction could not be serialized, past the timeout."""


_BUSY_MARKERS = ("database is locked", "database table is locked", "could not serialize",
                 "deadlock detected", "lock timeout", "canceling statement due to lock timeout")

#: Driver messages of a broken connection (when SQLAlchemy did not flag it itself).
_LOST_MARKERS = ("terminating connection due to administrator command",
                 "server closed the connection unexpectedly", "connection is closed",
                 "the connection is lost", "consuming input failed", "connection refused",
                 "could not receive data from server", "ssl connection has been closed",
                 "the database system is starting up", "the database system is shutting down",
                 "the database system is in recovery mode", "connection timeout expired",
                 "could not connect to server", "no route to host")

#: PostgreSQL SQLSTATEs of a lost or refused connection (class 08, and the server
#: shutting down, crashing or starting up: 57P01-57P03), and of a lock or
#: serialization failure (40001, 40P01, 55P03) or too many connections (53300),
#: which every server language reports alike.
_LOST_STATES = ("57P01", "57P02", "57P03")
_BUSY_STATES = ("40001", "40P01", "55P03", "53300")


#: SQLite before 3.42 meeting a search index a newer SQLite deleted from in place.
_NEWER_INDEX = (
    "the database's search index was last written by SQLite 3.42 or newer (memstore's "
    "forget deletes from it in place there), and this SQLite cannot read it ({}). Fix: "
    "rebuild it here with `memstore search --rebuild-index --url <database url>` (or "
    "memstore.migrate.rebuild_search_index()), or use a Python whose sqlite3 has SQLite "
    "3.42 or newer")


def _sqlstate(orig: object) -> str:
    """The driver exception's SQLSTATE (psycopg: ``sqlstate``; others: ``pgcode``), or ""."""
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return code if isinstance(code, str) else ""


@contextmanager
def translate_db_errors() -> Iterator[None]:
    """Convert SQLAlchemy/driver exceptions raised inside the block into memstore errors.

    memstore's own errors pass through unchanged. Integrity violations become
    `ConflictError`, lock/serialization failures `DatabaseBusyError`,
    a pool with no free connection past its timeout `DatabaseBusyError` too,
    everything else from SQLAlchemy `DatabaseError`.
    """
    try:
        yield
    except MemstoreError:
        raise
    except sa_exc.IntegrityError as exc:
        raise ConflictError(f"the write conflicts with stored data: {exc.orig}") from exc
    except sa_exc.DBAPIError as exc:
        text = str(exc.orig).lower()
        state = _sqlstate(exc.orig)
        if state in _BUSY_STATES or any(marker in text for marker in _BUSY_MARKERS):
            raise DatabaseBusyError(f"the database is busy: {exc.orig}") from exc
        if "invalid fts5 file format" in text:
            raise ConfigurationError(_NEWER_INDEX.format(exc.orig)) from exc
        if (exc.connection_invalidated or state.startswith("08") or state in _LOST_STATES
                or any(marker in text for marker in _LOST_MARKERS)):
            raise ConnectionLostError(
                f"the database connection failed or was lost (retryable): {exc.orig}"
            ) from exc
        raise DatabaseError(f"database error: {exc.orig}") from exc
    except sa_exc.TimeoutError as exc:  # no pooled connection came free in pool_timeout
        raise DatabaseBusyError(
            f"every connection of the store's pool stayed in use past its pool_timeout "
            f"(retryable; raise pool_size= or max_overflow= for more concurrent calls): {exc}"
        ) from exc
    except sa_exc.SQLAlchemyError as exc:
        raise DatabaseError(f"database error: {exc}") from exc
