"""The small hybrid-attention engine (KDA-style linear + MLA / GQA / SWA) on CPU.

Public API: EngineBase (the workers' interface), Engine (the torch model behind it),
EngineConfig, ByteTokenizer, PrefillResult, DecodeSeq, SamplingParams, LayerKV, SequenceKV,
and the numpy wire helpers layer_kv_to_arrays / layer_kv_from_arrays.
"""

from prfaas.engine.base import DecodeSeq, EngineBase, PrefillResult
from prfaas.engine.engine import Engine
from prfaas.engine.kv import LayerKV, SequenceKV
from prfaas.engine.sampling import SamplingParams, sample
from prfaas.engine.wire_adapter import layer_kv_from_arrays, layer_kv_to_arrays
from prfaas.models.engine_config import EngineConfig
from prfaas.models.tokenizer import ByteTokenizer

__all__ = [
    "ByteTokenizer",
    "DecodeSeq",
    "Engine",
    "EngineBase",
    "EngineConfig",
    "LayerKV",
    "PrefillResult",
    "SamplingParams",
    "SequenceKV",
    "layer_kv_from_arrays",
    "layer_kv_to_arrays",
    "sample",
]
