"""KV transport: a documented binary wire format (docs/wire-format.md), a multi-connection TCP
sender with backpressure and an in-process token-bucket link shaper, a reassembling receiver,
and a link monitor. Torch-free: payloads are numpy arrays. Errors are `TransportError`s."""

from prfaas.transport.assembly import ReceivedKV
from prfaas.transport.errors import (
    BadHeader,
    BadMagic,
    BadShape,
    ChecksumMismatch,
    ConnectFailed,
    FrameTooLarge,
    PeerAborted,
    PeerGone,
    ShortRead,
    TransferTimeout,
)
from prfaas.transport.monitor import LinkMonitor, LinkSample
from prfaas.transport.receiver import KVReceiver, ReceiverConfig
from prfaas.transport.sender import KVSender, SenderConfig, SenderStats
from prfaas.transport.shaper import TokenBucket
from prfaas.transport.streaming import LayerSink, stream_prefill
from prfaas.transport.wire import DType, Kind, Limits

__all__ = [
    "BadHeader",
    "BadMagic",
    "BadShape",
    "ChecksumMismatch",
    "ConnectFailed",
    "DType",
    "FrameTooLarge",
    "KVReceiver",
    "KVSender",
    "Kind",
    "LayerSink",
    "Limits",
    "LinkMonitor",
    "LinkSample",
    "PeerAborted",
    "PeerGone",
    "ReceivedKV",
    "ReceiverConfig",
    "SenderConfig",
    "SenderStats",
    "ShortRead",
    "TokenBucket",
    "TransferTimeout",
    "stream_prefill",
]
