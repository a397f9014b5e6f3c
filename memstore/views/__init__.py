"""Context views: token- or size-limited windows over one conversation (pure: no SQL).

The view classes live in `memstore.views.builtin` (their shared checks and the
report ledger in `memstore.views.parts`), tool-call units in
`memstore.views.units`, the read protocol a view pulls from in
`memstore.views.history`, and [`SummaryView`][memstore.SummaryView] in `memstore.views.summary`.
Nothing here imports SQLAlchemy, a store or `memstore._db`.
"""

from memstore.views.base import ContextView, checked_window
from memstore.views.builtin import (
    DEFAULT_PLACEHOLDER_TEMPLATE,
    BufferedView,
    HeadAndTailView,
    RecentTurnsView,
    ScoreBasedView,
    TokenLimitedView,
    UnboundedView,
    view_from_config,
)
from memstore.views.history import HistorySource, ListHistory
from memstore.views.summary import SummaryView

__all__ = [
    "DEFAULT_PLACEHOLDER_TEMPLATE",
    "BufferedView",
    "ContextView",
    "HeadAndTailView",
    "HistorySource",
    "ListHistory",
    "RecentTurnsView",
    "ScoreBasedView",
    "SummaryView",
    "TokenLimitedView",
    "UnboundedView",
    "checked_window",
    "view_from_config",
]
