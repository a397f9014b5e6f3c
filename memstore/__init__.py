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

from memstore._db.cache import CacheInfo
from memstore.context.builder import (
    Block,
    CompiledContext,
    CompileReport,
    ContextBuilder,
    Drop,
    HistoryBlock,
    Strategy,
    Strict,
    Summarize,
    Tier,
    TruncateOldest,
)
from memstore.context.formatters import MarkdownListFormatter, XMLFormatter, inject_into_system
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
    ContentPart,
    Conversation,
    ConversationState,
    ImagePart,
    ImageURL,
    LoadReport,
    Message,
    StoredMessage,
    StoreStats,
    Summary,
    TextPart,
    ToolCall,
)
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

if _TYPE_CHECKING:
    from memstore.aio import AsyncChatContext, AsyncMemoryStore

    __version__: str

#: Names imported on first use (PEP 562), so that ``import memstore`` stays quick for a
#: fresh worker or a CLI call: the async store imports SQLAlchemy's asyncio extension and
#: its ORM (a tenth of a second), and the version is read from the package metadata.
_LAZY = {"AsyncChatContext": "memstore.aio", "AsyncMemoryStore": "memstore.aio"}


def __getattr__(name: str) -> _Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
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
    "ReadOnlyError",
    "RecentTurnsView",
    "SchemaOutOfDateError",
    "SchemaTooNewError",
    "ScoreBasedView",
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
