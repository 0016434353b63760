"""Typed transport failures, all subclasses of `prfaas.core.errors.TransportError`.

Socket, OS and asyncio errors are translated into these at the transport boundary, so callers
catch one family and read `str(err)` to learn what was wrong (the offending value is named).
"""

from __future__ import annotations

from prfaas.core.errors import TransportError


class BadMagic(TransportError):
    """A frame header did not start with the protocol magic (or named an unknown version)."""


class ChecksumMismatch(TransportError):
    """The crc32 of a header or payload differs from the one the frame carries."""


class ShortRead(TransportError):
    """The peer closed the connection in the middle of a frame, or a request ended incomplete."""


class PeerGone(TransportError):
    """The peer closed or reset the connection while a transfer was in flight on it."""


class ConnectFailed(TransportError):
    """A connection to the receiver could not be opened."""


class FrameTooLarge(TransportError):
    """A chunk or tensor length exceeds the receiver's configured limits."""


class BadShape(TransportError):
    """Shape, dtype, kind or chunk bounds in a header are absurd or inconsistent."""


class TransferTimeout(TransportError, TimeoutError):
    """A network operation or a whole transfer did not finish within its timeout."""


class PeerAborted(TransportError):
    """The sender aborted the request (an ABORT frame) and said why."""


class BadHeader(TransportError):
    """A header names an unknown frame type, dtype or kind code."""


class BadPayload(TransportError):
    """A compressed payload does not decompress, or not to the length its frame declares."""
