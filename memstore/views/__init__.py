"""Context views: token- or size-limited windows over one conversation (pure: no SQL).

The view classes live in :mod:`memstore.views.builtin` (their shared checks and the
report ledger in :mod:`memstore.views.parts`), tool-call units in
:mod:`memstore.views.units`, the read protocol a view pulls from in
:mod:`memstore.views.history`, and :class:`SummaryView` in :mod:`memstore.views.summary`.
Nothing here imports SQLAlchemy, a store or :mod:`memstore._db`.
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
