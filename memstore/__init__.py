"""memstore: durable, database-backed conversation memory for LLM agents.

Store every message of every conversation in SQLite or PostgreSQL and assemble
token-budgeted context windows per conversation id::

    from memstore import MemoryStore, Message, TokenLimitedView

    store = MemoryStore()                       # $MEMSTORE_URL or sqlite:///./memstore.db
    store.append("chat-1", Message.user("Hello"))
    window = store.window("chat-1", TokenLimitedView(token_limit=4000))
    window.to_openai()
"""

from importlib.metadata import PackageNotFoundError, version

from memstore._cache import CacheInfo
from memstore.aio import AsyncChatContext, AsyncMemoryStore
from memstore.builder import (
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
from memstore.errors import (
    ConfigurationError,
    ConflictError,
    ContextBudgetError,
    ConversationNotFoundError,
    DatabaseBusyError,
    DatabaseError,
    InvalidInputError,
    MemstoreError,
    MessageNotFoundError,
    MissingDependencyError,
    NotFoundError,
    SchemaOutOfDateError,
    TokenizerUnavailableError,
)
from memstore.formatters import MarkdownListFormatter, XMLFormatter, inject_into_system
from memstore.history import HistorySource, ListHistory
from memstore.models import (
    ContentPart,
    ContextWindow,
    Conversation,
    ConversationState,
    ImagePart,
    ImageURL,
    Message,
    Omission,
    StoredMessage,
    TextPart,
    ToolCall,
    WindowReport,
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

try:
    __version__ = version("memstore")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0"

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
    "Drop",
    "FixedCounter",
    "HeadAndTailView",
    "HistoryBlock",
    "HistorySource",
    "ImagePart",
    "ImageURL",
    "InvalidInputError",
    "ListHistory",
    "MarkdownListFormatter",
    "MemoryStore",
    "MemstoreError",
    "Message",
    "MessageNotFoundError",
    "MissingDependencyError",
    "NotFoundError",
    "Omission",
    "RecentTurnsView",
    "SchemaOutOfDateError",
    "ScoreBasedView",
    "StoredMessage",
    "Strategy",
    "Strict",
    "Summarize",
    "TextPart",
    "Tier",
    "TiktokenCounter",
    "TokenCounter",
    "TokenLimitedView",
    "TokenizerUnavailableError",
    "ToolCall",
    "TruncateOldest",
    "UnboundedView",
    "WindowReport",
    "XMLFormatter",
    "__version__",
    "counter_from_name",
    "inject_into_system",
    "view_from_config",
]
