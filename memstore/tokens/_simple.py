"""Simple counters: `FixedCounter` (arithmetic) and `ApproxCounter` (a ratio)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from memstore._validate import MAX_TOKEN_COUNT, short_repr
from memstore.errors import ConfigurationError
from memstore.models import Message, TextPart
from memstore.tokens._base import BaseTokenCounter
from memstore.tokens._images import DEFAULT_IMAGE_RULE

__all__ = ["ApproxCounter", "FixedCounter"]


class FixedCounter(BaseTokenCounter):
    """Deterministic arithmetic counter for tests and examples.

    ``count_message = per_message + per_tool_call * len(tool_calls) + per_word * words``
    where ``words`` is the number of whitespace-separated words of the message text.

    Args:
        per_message: tokens charged for every message.
        per_tool_call: tokens charged for every tool call of an assistant message.
        per_word: tokens charged per word of the text.
        priming: tokens added once per request by ``count_messages``.
        per_tool_schema: tokens charged per tool schema by ``count_tools``.

    Raises:
        ConfigurationError: a parameter is not an int in ``[0, 2**31 - 1]``
            (`ConfigurationError` is a ``ValueError``).
    """

    def __init__(
        self,
        per_message: int = 1,
        *,
        per_tool_call: int = 0,
        per_word: int = 0,
        priming: int = 0,
        per_tool_schema: int = 0,
    ) -> None:
        params = {
            "per_message": per_message,
            "per_tool_call": per_tool_call,
            "per_word": per_word,
            "priming": priming,
            "per_tool_schema": per_tool_schema,
        }
        for key, value in params.items():
            if (not isinstance(value, int) or isinstance(value, bool)
                    or not 0 <= value <= MAX_TOKEN_COUNT):
                raise ConfigurationError(
                    f"FixedCounter {key} must be an int in [0, {MAX_TOKEN_COUNT}], "
                    f"got {short_repr(value)}"
                )
        self.per_message = per_message
        self.per_tool_call = per_tool_call
        self.per_word = per_word
        self._priming = priming
        self.per_tool_schema = per_tool_schema
        self._name = (
            f"fixed/{per_message}/{per_tool_call}/{per_word}/{priming}/{per_tool_schema}"
        )

    @property
    def name(self) -> str:
        """``fixed/<per_message>/<per_tool_call>/<per_word>/<priming>/<per_tool_schema>``."""
        return self._name

    @property
    def priming(self) -> int:
        """Tokens added once per request."""
        return self._priming

    def count_message(self, message: Message) -> int:
        """``per_message + per_tool_call * calls + per_word * words``.

        Words are counted in each text part on its own (two parts never join a word).
        """
        content = message.content
        if not self.per_word or content is None:
            words = 0
        elif isinstance(content, str):
            words = len(content.split())
        else:
            words = sum(len(p.text.split()) for p in content if p.type == "text")
        calls = len(message.tool_calls or ())
        return self.per_message + self.per_tool_call * calls + self.per_word * words

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """``per_tool_schema * len(tools)``."""
        return self.per_tool_schema * len(tools)


class ApproxCounter(BaseTokenCounter):
    """Character-ratio estimate: deterministic, dependency-free, never exact.

    Per message: ``3 + ceil(chars / chars_per_token) + images``, where ``chars``
    is the number of characters of the text (string content or text parts), the
    ``name``, every tool call's function name and arguments, and ``tool_call_id``.
    The role is covered by the fixed 3. ``priming`` is 3, as for OpenAI models.
    ``count_tools`` is ``ceil(len(json.dumps(tools)) / chars_per_token)``.

    ``images`` is what [`TiktokenCounter`][memstore.TiktokenCounter] charges by default:
    OpenAI's GPT-4o price, which depends on the image, not on a tokenizer. 85 for
    ``detail="low"``; otherwise 85 + 170 per 512px tile when the size can be read from
    a base64 ``data:`` URI, and 1445 (the most the rule allows) when it cannot (a
    remote URL). An approximate counter must not undercount a large image by an order
    of magnitude: a 2048x2048 high-detail image costs 765, not 85.

    The ceiling is computed exactly (in rational arithmetic), so
    ``ApproxCounter(0.1)`` charges 30 tokens for 3 characters, not 31.

    Args:
        chars_per_token: characters per token; 4 is the usual figure for English.

    Raises:
        ConfigurationError: ``chars_per_token`` is not a finite number > 0
            (`ConfigurationError` is a ``ValueError``).
    """

    tokens_per_message = 3

    def __init__(self, chars_per_token: float = 4) -> None:
        if isinstance(chars_per_token, bool) or not isinstance(chars_per_token, (int, float)):
            raise ConfigurationError(
                f"ApproxCounter chars_per_token must be a number, got {short_repr(chars_per_token)}"
            )
        try:
            cpt = float(chars_per_token)
        except OverflowError:  # an int past float's range
            cpt = math.inf
        if not math.isfinite(cpt) or cpt <= 0:
            raise ConfigurationError(
                "ApproxCounter chars_per_token must be a finite number > 0, "
                f"got {short_repr(chars_per_token)}"
            )
        self._cpt = cpt
        self._ratio = Fraction(cpt)
        self._name = f"approx/{int(cpt)}" if cpt.is_integer() else f"approx/{cpt!r}"

    @property
    def chars_per_token(self) -> float:
        """Characters per token."""
        return self._cpt

    @property
    def name(self) -> str:
        """``approx/<chars_per_token>`` (``approx/4`` for 4 or 4.0, ``approx/3.5``)."""
        return self._name

    @property
    def priming(self) -> int:
        """Tokens added once per request (3)."""
        return 3

    def _tokens(self, chars: int) -> int:
        return math.ceil(Fraction(chars) / self._ratio) if chars else 0

    def count_message(self, message: Message) -> int:
        """``3 + ceil(chars / chars_per_token)`` plus each image's GPT-4o price.

        Args:
            message: the message to count.

        Returns:
            The estimated tokens of the message.
        """
        chars = 0
        images = 0
        content = message.content
        if isinstance(content, str):
            chars += len(content)
        elif content is not None:
            for part in content:
                if isinstance(part, TextPart):
                    chars += len(part.text)
                else:
                    images += DEFAULT_IMAGE_RULE.tokens(part)
        if message.name is not None:
            chars += len(message.name)
        for call in message.tool_calls or ():
            chars += len(call.name) + len(call.arguments)
        if message.tool_call_id is not None:
            chars += len(message.tool_call_id)
        return self.tokens_per_message + self._tokens(chars) + images

    def count_text(self, text: str) -> int:
        """``ceil(len(text) / chars_per_token)``: the hook `count_tools()` uses.

        ``count_tools(tools)`` is therefore ``ceil(len(json.dumps(tools)) /
        chars_per_token)`` (non-ASCII kept), 0 for no tools.

        Args:
            text: any string.

        Returns:
            The estimated tokens of the text.
        """
        return self._tokens(len(text))
