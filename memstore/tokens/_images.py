"""Image tokens by OpenAI's vision pricing, computed without fetching anything."""

from __future__ import annotations

import base64
import binascii

from memstore.models import ImagePart

_IMAGE_BASE_TOKENS = 85
_IMAGE_TILE_TOKENS = 170
_IMAGE_TILE = 512
_IMAGE_MAX_LONG_EDGE = 2048
_IMAGE_SHORT_EDGE = 768
#: High/auto detail image whose size cannot be read from the part (a remote URL):
#: charged the most the tile rule can produce (a 2048x768 image: 4x2 tiles), so a
#: budget that holds under this counter also holds for the real image.
_IMAGE_UNKNOWN_SIZE_TOKENS = _IMAGE_BASE_TOKENS + _IMAGE_TILE_TOKENS * 8


def _vision_tokens(width: int, height: int) -> int:
    """High-detail image tokens by OpenAI's tile rule (GPT-4o / GPT-4 Turbo vision).

    The image is scaled to fit in 2048x2048, then (when both sides exceed 768)
    scaled so its short side is 768; the cost is 85 + 170 per 512px tile.
    """
    if width <= 0 or height <= 0:
        return _IMAGE_UNKNOWN_SIZE_TOKENS
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
    tiles = -(-width // _IMAGE_TILE) * -(-height // _IMAGE_TILE)
    return _IMAGE_BASE_TOKENS + _IMAGE_TILE_TOKENS * tiles


def _image_tokens(part: ImagePart) -> int:
    """Tokens of one image part under OpenAI's vision rule.

    ``detail="low"`` costs 85. ``"high"``, ``"auto"`` and unset are charged as high
    detail: by the tile rule when the part is a base64 ``data:`` URI whose PNG, JPEG,
    GIF or WebP header gives the size, else :data:`_IMAGE_UNKNOWN_SIZE_TOKENS`.
    """
    if part.image_url.detail == "low":
        return _IMAGE_BASE_TOKENS
    size = _data_uri_image_size(part.image_url.url)
    if size is None:
        return _IMAGE_UNKNOWN_SIZE_TOKENS
    return _vision_tokens(*size)


def _data_uri_image_size(url: str) -> tuple[int, int] | None:
    """``(width, height)`` of a base64 ``data:`` image URI, or None when unknown."""
    if not url.startswith("data:"):
        return None
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        return None
    try:
        data = base64.b64decode(payload)
    except (binascii.Error, ValueError):
        return None
    return _image_size(data)


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
    while i + 4 <= n:
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
