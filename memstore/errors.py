"""The memstore error tree, and the one place where database errors are translated.

Every error memstore raises on purpose derives from :class:`MemstoreError`::

    MemstoreError
    ├── ConfigurationError (ValueError)         bad store/view/counter configuration
    │   └── MissingDependencyError (ImportError) an optional package is not installed
    ├── InvalidInputError (ValueError)          a call argument is invalid; nothing was written
    ├── NotFoundError (LookupError)
    │   ├── ConversationNotFoundError
    │   └── MessageNotFoundError
    ├── ConflictError                           idempotency key reused with other content, or
    │                                           a conversation id that already exists
    ├── ContextBudgetError                      anchored messages + newest unit exceed a budget
    ├── TokenizerUnavailableError               an encoding cannot be loaded (offline)
    ├── SchemaOutOfDateError                    the database schema is not at memstore's head
    └── DatabaseError                           any other driver/SQLAlchemy failure
        └── DatabaseBusyError                   lock timeout / serialization failure

Invalid *model* input (a message with an unknown role, a tool message without
``tool_call_id`` …) raises :class:`pydantic.ValidationError` from the model
constructors, before any database work starts.

SQLAlchemy and driver exceptions are converted only by :func:`translate_db_errors`,
always chained (``raise ... from exc``) so the original stays visible.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc

__all__ = [
    "ConfigurationError",
    "ConflictError",
    "ContextBudgetError",
    "ConversationNotFoundError",
    "DatabaseBusyError",
    "DatabaseError",
    "InvalidInputError",
    "MemstoreError",
    "MessageNotFoundError",
    "MissingDependencyError",
    "NotFoundError",
    "SchemaOutOfDateError",
    "TokenizerUnavailableError",
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


class ConflictError(MemstoreError):
    """A write conflicts with what is stored (idempotency key reuse, duplicate id)."""


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


class DatabaseBusyError(DatabaseError):
    """The database stayed locked, or a transaction could not be serialized, past the timeout."""


_BUSY_MARKERS = ("database is locked", "database table is locked", "could not serialize",
                 "deadlock detected", "lock timeout", "canceling statement due to lock timeout")


@contextmanager
def translate_db_errors() -> Iterator[None]:
    """Convert SQLAlchemy/driver exceptions raised inside the block into memstore errors.

    memstore's own errors pass through unchanged. Integrity violations become
    :class:`ConflictError`, lock/serialization failures :class:`DatabaseBusyError`,
    everything else from SQLAlchemy :class:`DatabaseError`.
    """
    try:
        yield
    except MemstoreError:
        raise
    except sa_exc.IntegrityError as exc:
        raise ConflictError(f"the write conflicts with stored data: {exc.orig}") from exc
    except sa_exc.DBAPIError as exc:
        text = str(exc.orig).lower()
        if any(marker in text for marker in _BUSY_MARKERS):
            raise DatabaseBusyError(f"the database is busy: {exc.orig}") from exc
        raise DatabaseError(f"database error: {exc.orig}") from exc
    except sa_exc.SQLAlchemyError as exc:
        raise DatabaseError(f"database error: {exc}") from exc
