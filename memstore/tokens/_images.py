"""Image tokens by OpenAI's vision pricing, computed without fetching anything.

Source of every rule here: OpenAI's "Images and vision" guide, section "Calculating
costs" (https://platform.openai.com/docs/guides/images-vision#calculating-costs). It
prices an image part in one of two ways, chosen by model:

* **Tiles** (GPT-4o class): ``detail="low"`` costs a fixed ``base``; high detail scales
  the image to fit in 2048x2048, then so its short side is at most 768, and costs
  ``base + tile * (512px tiles)``. The guide's table of ``(base, tile)``:
  gpt-4o, gpt-4.1, gpt-4.5: 85/170; gpt-4o-mini: 2833/5667; o1, o1-pro, o3: 75/150;
  gpt-5, gpt-5-chat-latest: 70/140; computer-use-preview: 65/129.
* **Patches** (gpt-4.1-mini, gpt-4.1-nano, o4-mini, gpt-5-mini, gpt-5-nano): the
  32x32 patches that cover the image, at most 1536 (a larger image is first scaled
  down so 1536 patches cover it, by the guide's formula), times a per-model
  multiplier: 1.62 (gpt-4.1-mini, gpt-5-mini), 2.46 (gpt-4.1-nano, gpt-5-nano),
  1.72 (o4-mini). The guide names no ``detail`` effect for these.

Choices made here, where the guide says nothing or a budget must not undercount:

* ``detail="auto"`` and unset are charged as high detail (the API decides ``auto``
  from the image; high is the larger charge).
* An image whose size cannot be read from the part (a remote URL, an unreadable
  payload) is charged the most its rule can produce: ``base + 8 * tile`` for tiles
  (after scaling no image needs more than 4x2 tiles), ``1536 * multiplier`` for
  patches.
* A patch rule's fractional product is rounded up (the guide does not say how it
  rounds; up is at most one token over).
* Any model the table does not name is priced like GPT-4o (85/170), the rule memstore
  has always applied; see `image_rule_for_model()`.
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass
from fractions import Fraction

from memstore.errors import ConfigurationError
from memstore.models import ImagePart

_IMAGE_BASE_TOKENS = 85
_IMAGE_TILE_TOKENS = 170
_IMAGE_TILE = 512
_IMAGE_MAX_LONG_EDGE = 2048
_IMAGE_SHORT_EDGE = 768
#: The most 512px tiles a high-detail image can need after scaling (2048x768: 4x2).
_IMAGE_MAX_TILES = 8
#: High/auto detail image whose size cannot be read from the part (a remote URL):
#: charged the most the tile rule can produce (a 2048x768 image: 4x2 tiles), so a
#: budget that holds under this counter also holds for the real image.
_IMAGE_UNKNOWN_SIZE_TOKENS = _IMAGE_BASE_TOKENS + _IMAGE_TILE_TOKENS * _IMAGE_MAX_TILES

_PATCH = 32
#: The most 32px patches a patch-priced image is charged for (OpenAI's guide).
_PATCH_BUDGET = 1536


@dataclass(frozen=True)
class ImageRule:
    """How one family of OpenAI models prices an image part.

    ``kind`` is ``"tiles"`` (``base`` + ``tile`` per 512px tile) or ``"patches"``
    (32px patches times ``multiplier``). `spec` spells the rule as it appears in
    a counter's name.
    """

    kind: str
    base: int = 0
    tile: int = 0
    multiplier: Fraction = Fraction(0)

    @property
    def spec(self) -> str:
        """``tiles-<base>-<tile>`` or ``patches-<multiplier>`` (e.g. ``patches-1.62``)."""
        if self.kind == "tiles":
            return f"tiles-{self.base}-{self.tile}"
        return f"patches-{_decimal(self.multiplier)}"

    @property
    def max_tokens(self) -> int:
        """The most one image can cost under this rule (what an unmeasurable image costs)."""
        if self.kind == "tiles":
            return self.base + self.tile * _IMAGE_MAX_TILES
        return math.ceil(_PATCH_BUDGET * self.multiplier)

    def tokens(self, part: ImagePart) -> int:
        """Tokens of one image part under this rule (see the module docstring)."""
        if self.kind == "tiles" and part.image_url.detail == "low":
            return self.base
        size = _data_uri_image_size(part.image_url.url)
        if size is None or size[0] <= 0 or size[1] <= 0:
            return self.max_tokens
        width, height = size
        if self.kind == "tiles":
            return self.base + self.tile * _tiles(width, height)
        return math.ceil(_patches(width, height) * self.multiplier)


def _decimal(value: Fraction) -> str:
    """``value`` written exactly, without trailing zeros (``Fraction("1.620")`` -> ``1.62``).

    A multiplier comes from a decimal string, so its expansion ends; rounding it would
    name a counter that `image_rule_from_spec()` rebuilds with another multiplier.
    """
    scale = 0
    while (value * 10**scale).denominator != 1:
        if scale > _MAX_SCALE:  # not a decimal: no rule is built from one
            return f"{float(value):.6f}".rstrip("0").rstrip(".")
        scale += 1
    digits = str(int(value * 10**scale)).rjust(scale + 1, "0")
    whole, fraction = digits[:len(digits) - scale], digits[len(digits) - scale:]
    return f"{whole}.{fraction}" if scale else whole


#: More decimals than a counter name (64 characters) can hold.
_MAX_SCALE = 64
#: The most digits a patch multiplier has on each side of its point.
_MAX_DIGITS = 12


def _tiles_rule(base: int, tile: int) -> ImageRule:
    return ImageRule("tiles", base=base, tile=tile)


def _patches_rule(multiplier: str) -> ImageRule:
    return ImageRule("patches", multiplier=Fraction(multiplier))


#: GPT-4o's rule: the default, and the only rule that leaves a counter's name unchanged.
DEFAULT_IMAGE_RULE = _tiles_rule(_IMAGE_BASE_TOKENS, _IMAGE_TILE_TOKENS)

#: Model families of OpenAI's cost table (see the module docstring), most specific
#: first: a model is matched by its name or a name that continues with ``-`` (a dated
#: snapshot such as ``gpt-4o-mini-2024-07-18``).
_MODEL_RULES: tuple[tuple[str, ImageRule], ...] = (
    ("gpt-4o-mini", _tiles_rule(2833, 5667)),
    ("gpt-4.1-mini", _patches_rule("1.62")),
    ("gpt-4.1-nano", _patches_rule("2.46")),
    ("gpt-5-mini", _patches_rule("1.62")),
    ("gpt-5-nano", _patches_rule("2.46")),
    ("o4-mini", _patches_rule("1.72")),
    ("o1-pro", _tiles_rule(75, 150)),
    ("o1", _tiles_rule(75, 150)),
    ("o3", _tiles_rule(75, 150)),
    ("gpt-5-chat-latest", _tiles_rule(70, 140)),
    ("gpt-5", _tiles_rule(70, 140)),
    ("computer-use-preview", _tiles_rule(65, 129)),
    ("gpt-4o", DEFAULT_IMAGE_RULE),
    ("gpt-4.1", DEFAULT_IMAGE_RULE),
    ("gpt-4.5", DEFAULT_IMAGE_RULE),
)


def image_rule_for_model(model: str) -> ImageRule:
    """The image rule of an OpenAI model name (GPT-4o's for a model the table lacks).

    A fine-tuned model (``ft:gpt-4o-mini-2024-07-18:org::id``) is priced as its base
    model. Matching is by family name followed by nothing or ``-``, so ``gpt-5.1`` is
    *not* taken for ``gpt-5``: OpenAI's guide does not list it, and it gets the default.
    """
    family = model_family(model)
    return dict(_MODEL_RULES)[family] if family is not None else DEFAULT_IMAGE_RULE


def model_family(model: str) -> str | None:
    """The family of OpenAI's image table ``model`` belongs to (``None``: not in it).

    Every model of the table uses the ``o200k_base`` encoding.
    """
    name = model.lower()
    if name.startswith("ft:"):
        name = name[3:].split(":", 1)[0]
    for family, _rule in _MODEL_RULES:
        if name == family or name.startswith(family + "-"):
            return family
    return None


def image_rule_from_spec(spec: str) -> ImageRule:
    """Parse `ImageRule.spec` (``tiles-85-170``, ``patches-1.62``).

    Raises:
        ConfigurationError: ``spec`` is not one of those forms with positive numbers.
    """
    kind, _, rest = spec.partition("-")
    if not rest.isascii():
        rest = ""
    try:
        if kind == "tiles":
            base_text, _, tile_text = rest.partition("-")
            if base_text.isdecimal() and tile_text.isdecimal():
                base, tile = int(base_text), int(tile_text)
                if base > 0 and tile > 0:
                    return _tiles_rule(base, tile)
        elif (kind == "patches" and rest and rest.replace(".", "", 1).isdecimal()
              and len(rest.partition(".")[0]) <= _MAX_DIGITS
              and len(rest.partition(".")[2]) <= _MAX_DIGITS):
            # A bounded decimal: named exactly by _decimal (a longer one was named by a
            # rounded value, another counter's name).
            multiplier = Fraction(rest)
            if multiplier > 0:
                return ImageRule("patches", multiplier=multiplier)
    except (ValueError, ZeroDivisionError):
        pass
    raise ConfigurationError(
        f"unknown image pricing rule {spec!r}; expected 'tiles-<base>-<tile>' or "
        "'patches-<multiplier>' (at most 12 digits each side of the point; e.g. "
        "'tiles-2833-5667', 'patches-1.62')"
    )


def _tiles(width: int, height: int) -> int:
    """512px tiles of a high-detail image after OpenAI's two scalings."""
    if max(width, height) > _IMAGE_MAX_LONG_EDGE:
        longest = max(width, height)
        width, height = (
            max(1, width * _IMAGE_MAX_LONG_EDGE // longest),
            max(1, height * _IMAGE_MAX_LONG_EDGE // longest),
        )
    shortest = min(width, height)
    if shortest > _IMAGE_SHORT_EDGE:
        width, height = (
            width * _IMAGE_SHORT_EDGE // shortest,
            height * _IMAGE_SHORT_EDGE // shortest,
        )
    return -(-width // _IMAGE_TILE) * -(-height // _IMAGE_TILE)


def _patches(width: int, height: int) -> int:
    """32px patches charged for an image by OpenAI's patch rule, at most 1536.

    The guide's steps, in exact arithmetic: when ``ceil(w/32) * ceil(h/32)`` exceeds
    1536, ``r = sqrt(32**2 * 1536 / (w*h))`` and then
    ``r *= min(floor(w*r/32) / (w*r/32), floor(h*r/32) / (h*r/32))``; the image is
    scaled by ``r`` and covered again. Since ``w*r/32 = sqrt(1536*w/h)``, the floors are
    integer square roots, and the scaled side that decides ``r`` is a whole number of
    patches.
    """
    patches = -(-width // _PATCH) * -(-height // _PATCH)
    if patches <= _PATCH_BUDGET:
        return patches
    across = max(1, math.isqrt(_PATCH_BUDGET * width // height))  # floor(w*r/32)
    down = max(1, math.isqrt(_PATCH_BUDGET * height // width))  # floor(h*r/32)
    if across * height <= down * width:  # the width's factor is the smaller one
        resized = across * math.ceil(Fraction(height * across, width))
    else:
        resized = down * math.ceil(Fraction(width * down, height))
    return min(resized, _PATCH_BUDGET)


def _vision_tokens(width: int, height: int) -> int:
    """High-detail image tokens by OpenAI's tile rule for GPT-4o (85 + 170 per tile)."""
    if width <= 0 or height <= 0:
        return _IMAGE_UNKNOWN_SIZE_TOKENS
    return _IMAGE_BASE_TOKENS + _IMAGE_TILE_TOKENS * _tiles(width, height)


def _data_uri_image_size(url: str) -> tuple[int, int] | None:
    """``(width, height)`` of a base64 ``data:`` image URI, or None when unknown."""
    if not url.startswith("data:"):
        return None
    comma = url.find(",", 0, 512)  # (no copy of the payload: it may be 60 MB)
    if comma < 0 or not url.endswith(";base64", 0, comma):
        return None
    try:
        # The size is in the header: decode a bounded prefix, not a 60 MB payload on
        # every count (a size not found there prices the image at the rule's maximum).
        data = base64.b64decode(url[comma + 1:comma + 1 + _SIZE_PREFIX_CHARS])
    except (binascii.Error, ValueError):
        return None
    return _image_size(data)


#: The base64 characters decoded to find an image's size: 256 KiB of image data, past
#: the metadata (EXIF, ICC profiles, thumbnails) real JPEGs put before their frame.
_SIZE_PREFIX_CHARS = 4 * (256 * 1024 // 3)
#: Segments and fill bytes read before a JPEG's frame header (real files: a few dozen).
_JPEG_MAX_STEPS = 4096


def _image_size(data: bytes) -> tuple[int, int] | None:
    """Read width and height from a PNG, GIF, JPEG or WebP header."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width = int.from_bytes(data[26:28], "little") & 0x3FFF
        height = int.from_bytes(data[28:30], "little") & 0x3FFF
        return width, height
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic...).
_JPEG_SOF = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    n = len(data)
    for _ in range(_JPEG_MAX_STEPS):
        if i + 4 > n:
            return None
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # no length field
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame
            return None
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if marker in _JPEG_SOF:
            if i + 9 > n:
                return None
            height = int.from_bytes(data[i + 5 : i + 7], "big")
            width = int.from_bytes(data[i + 7 : i + 9], "big")
            return width, height
        if length < 2:
            return None
        i += 2 + length
    return None
