"""memstore: durable, database-backed conversation memory for LLM agents.

Store every message of every conversation in SQLite or PostgreSQL and assemble
token-budgeted context windows per conversation id::

    from memstore import MemoryStore, Message, TokenLimitedView

    store = MemoryStore()                       # $MEMSTORE_URL or sqlite:///./memstore.db
    store.append("chat-1", Message.user("Hello"))
    window = store.window("chat-1", TokenLimitedView(token_limit=4000))
    window.to_openai()
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

if _TYPE_CHECKING:  # what type checkers and IDEs see; at run time, `__getattr__` below
    from memstore._db.cache import CacheInfo
    from memstore.aio import AsyncChatContext, AsyncMemoryStore
    from memstore.context.builder import (
        Block,
        ContextBuilder,
        Drop,
        HistoryBlock,
        Strategy,
        Strict,
        Summarize,
        Tier,
        TruncateOldest,
    )
    from memstore.context.compiled import CompiledContext, CompileReport
    from memstore.context.formatters import MarkdownListFormatter, XMLFormatter, inject_into_system
    from memstore.context.recall import Recall, RecallReport
    from memstore.errors import (
        ConfigurationError,
        ConflictError,
        ConnectionLostError,
        ContextBudgetError,
        ConversationNotFoundError,
        DatabaseBusyError,
        DatabaseError,
        DatabaseNotFoundError,
        ImportFormatError,
        InvalidInputError,
        MemstoreError,
        MessageNotFoundError,
        MissingDependencyError,
        NotFoundError,
        ReadOnlyError,
        SchemaOutOfDateError,
        SchemaTooNewError,
        StoreClosedError,
        TokenizerUnavailableError,
        TransientError,
    )
    from memstore.models import (
        AuditEntry,
        ContentPart,
        Conversation,
        ConversationState,
        ForgetReport,
        ImagePart,
        ImageURL,
        LoadReport,
        Message,
        PruneReport,
        StoredMessage,
        StoreStats,
        Summary,
        TextPart,
        ToolCall,
    )
    from memstore.search import SearchHit
    from memstore.store import ChatContext, MemoryStore
    from memstore.tokens import (
        ApproxCounter,
        BaseTokenCounter,
        FixedCounter,
        TiktokenCounter,
        TokenCounter,
        counter_from_name,
    )
    from memstore.transfer import (
        ExportResult,
        ImportedConversation,
        ImportResult,
        export_jsonl,
        import_jsonl,
    )
    from memstore.views import (
        BufferedView,
        ContextView,
        HeadAndTailView,
        RecentTurnsView,
        ScoreBasedView,
        TokenLimitedView,
        UnboundedView,
        view_from_config,
    )
    from memstore.views.history import HistorySource, ListHistory
    from memstore.views.summary import SummaryView
    from memstore.views.window import ContextWindow, Omission, WindowReport

    __version__: str

#: Where each public name is defined. Names are imported on first use (PEP 562), so
#: ``import memstore`` (and ``import memstore.errors``, or the ``memstore`` command's
#: ``--help``) costs next to nothing: a name's module, and what it needs (SQLAlchemy,
#: pydantic, the views...), is imported the first time the name is looked up, and kept.
#: ``from memstore import MemoryStore`` works as always. The version is read from the
#: package metadata on first use.
_LAZY: dict[str, str] = {
    "ApproxCounter": "memstore.tokens",
    "AsyncChatContext": "memstore.aio",
    "AsyncMemoryStore": "memstore.aio",
    "AuditEntry": "memstore.models",
    "BaseTokenCounter": "memstore.tokens",
    "Block": "memstore.context.builder",
    "BufferedView": "memstore.views",
    "CacheInfo": "memstore._db.cache",
    "ChatContext": "memstore.store",
    "CompileReport": "memstore.context.compiled",
    "CompiledContext": "memstore.context.compiled",
    "ConfigurationError": "memstore.errors",
    "ConflictError": "memstore.errors",
    "ConnectionLostError": "memstore.errors",
    "ContentPart": "memstore.models",
    "ContextBudgetError": "memstore.errors",
    "ContextBuilder": "memstore.context.builder",
    "ContextView": "memstore.views",
    "ContextWindow": "memstore.views.window",
    "Conversation": "memstore.models",
    "ConversationNotFoundError": "memstore.errors",
    "ConversationState": "memstore.models",
    "DatabaseBusyError": "memstore.errors",
    "DatabaseError": "memstore.errors",
    "DatabaseNotFoundError": "memstore.errors",
    "Drop": "memstore.context.builder",
    "ExportResult": "memstore.transfer",
    "FixedCounter": "memstore.tokens",
    "ForgetReport": "memstore.models",
    "HeadAndTailView": "memstore.views",
    "HistoryBlock": "memstore.context.builder",
    "HistorySource": "memstore.views.history",
    "ImagePart": "memstore.models",
    "ImageURL": "memstore.models",
    "ImportFormatError": "memstore.errors",
    "ImportResult": "memstore.transfer",
    "ImportedConversation": "memstore.transfer",
    "InvalidInputError": "memstore.errors",
    "ListHistory": "memstore.views.history",
    "LoadReport": "memstore.models",
    "MarkdownListFormatter": "memstore.context.formatters",
    "MemoryStore": "memstore.store",
    "MemstoreError": "memstore.errors",
    "Message": "memstore.models",
    "MessageNotFoundError": "memstore.errors",
    "MissingDependencyError": "memstore.errors",
    "NotFoundError": "memstore.errors",
    "Omission": "memstore.views.window",
    "PruneReport": "memstore.models",
    "ReadOnlyError": "memstore.errors",
    "Recall": "memstore.context.recall",
    "RecallReport": "memstore.context.recall",
    "RecentTurnsView": "memstore.views",
    "SchemaOutOfDateError": "memstore.errors",
    "SchemaTooNewError": "memstore.errors",
    "ScoreBasedView": "memstore.views",
    "SearchHit": "memstore.search",
    "StoreClosedError": "memstore.errors",
    "StoreStats": "memstore.models",
    "StoredMessage": "memstore.models",
    "Strategy": "memstore.context.builder",
    "Strict": "memstore.context.builder",
    "Summarize": "memstore.context.builder",
    "Summary": "memstore.models",
    "SummaryView": "memstore.views.summary",
    "TextPart": "memstore.models",
    "Tier": "memstore.context.builder",
    "TiktokenCounter": "memstore.tokens",
    "TokenCounter": "memstore.tokens",
    "TokenLimitedView": "memstore.views",
    "TokenizerUnavailableError": "memstore.errors",
    "ToolCall": "memstore.models",
    "TransientError": "memstore.errors",
    "TruncateOldest": "memstore.context.builder",
    "UnboundedView": "memstore.views",
    "WindowReport": "memstore.views.window",
    "XMLFormatter": "memstore.context.formatters",
    "counter_from_name": "memstore.tokens",
    "export_jsonl": "memstore.transfer",
    "import_jsonl": "memstore.transfer",
    "inject_into_system": "memstore.context.formatters",
    "view_from_config": "memstore.views",
}


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is not None:
        import importlib

        value = getattr(importlib.import_module(module), name)
    elif name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("memstore")
        except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
            value = "0.0.0"
    else:
        raise AttributeError(f"module 'memstore' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "ApproxCounter",
    "AsyncChatContext",
    "AsyncMemoryStore",
    "AuditEntry",
    "BaseTokenCounter",
    "Block",
    "BufferedView",
    "CacheInfo",
    "ChatContext",
    "CompileReport",
    "CompiledContext",
    "ConfigurationError",
    "ConflictError",
    "ConnectionLostError",
    "ContentPart",
    "ContextBudgetError",
    "ContextBuilder",
    "ContextView",
    "ContextWindow",
    "Conversation",
    "ConversationNotFoundError",
    "ConversationState",
    "DatabaseBusyError",
    "DatabaseError",
    "DatabaseNotFoundError",
    "Drop",
    "ExportResult",
    "FixedCounter",
    "ForgetReport",
    "HeadAndTailView",
    "HistoryBlock",
    "HistorySource",
    "ImagePart",
    "ImageURL",
    "ImportFormatError",
    "ImportResult",
    "ImportedConversation",
    "InvalidInputError",
    "ListHistory",
    "LoadReport",
    "MarkdownListFormatter",
    "MemoryStore",
    "MemstoreError",
    "Message",
    "MessageNotFoundError",
    "MissingDependencyError",
    "NotFoundError",
    "Omission",
    "PruneReport",
    "ReadOnlyError",
    "Recall",
    "RecallReport",
    "RecentTurnsView",
    "SchemaOutOfDateError",
    "SchemaTooNewError",
    "ScoreBasedView",
    "SearchHit",
    "StoreClosedError",
    "StoreStats",
    "StoredMessage",
    "Strategy",
    "Strict",
    "Summarize",
    "Summary",
    "SummaryView",
    "TextPart",
    "Tier",
    "TiktokenCounter",
    "TokenCounter",
    "TokenLimitedView",
    "TokenizerUnavailableError",
    "ToolCall",
    "TransientError",
    "TruncateOldest",
    "UnboundedView",
    "WindowReport",
    "XMLFormatter",
    "__version__",
    "counter_from_name",
    "export_jsonl",
    "import_jsonl",
    "inject_into_system",
    "view_from_config",
]
