"""Public data model: messages, stored messages, conversations, summaries and state.

The canonical message shape is OpenAI's chat format. Every model here is a frozen
pydantic v2 model; invalid input raises `pydantic.ValidationError` naming the
field, before anything is written.

The input rules (`memstore._validate`) hold in every model: strings are text both
databases store exactly (no NUL, no surrogate code point), JSON values hold only
numbers PostgreSQL's ``jsonb`` gives back unchanged and nest at most 64 levels, and
seqs, token counts and counter names fit their columns.

What a view returns ([`ContextWindow`][memstore.ContextWindow],
[`WindowReport`][memstore.WindowReport],
[`Omission`][memstore.Omission]) lives in `memstore.views.window`, above the
provider formats it renders to.
"""

from memstore.models.common import (
    ANCHOR_ROLES,
    DEFAULT_SUMMARY_TEMPLATE,
    MAX_ID_LENGTH,
    READABLE_STATE_VERSIONS,
    ROLES,
    STATE_VERSION,
    Role,
    same_json,
)
from memstore.models.message import Message, StoredMessage, build_trusted, checked_message
from memstore.models.parts import ContentPart, ImagePart, ImageURL, TextPart, ToolCall
from memstore.models.records import (
    AuditEntry,
    Conversation,
    ConversationState,
    ForgetReport,
    LoadReport,
    PruneReport,
    StoreStats,
    Summary,
    repeated_id,
)

__all__ = [
    "ANCHOR_ROLES",
    "DEFAULT_SUMMARY_TEMPLATE",
    "MAX_ID_LENGTH",
    "READABLE_STATE_VERSIONS",
    "ROLES",
    "STATE_VERSION",
    "AuditEntry",
    "ContentPart",
    "Conversation",
    "ConversationState",
    "ForgetReport",
    "ImagePart",
    "ImageURL",
    "LoadReport",
    "Message",
    "PruneReport",
    "Role",
    "StoreStats",
    "StoredMessage",
    "Summary",
    "TextPart",
    "ToolCall",
    "build_trusted",
    "checked_message",
    "repeated_id",
    "same_json",
]
