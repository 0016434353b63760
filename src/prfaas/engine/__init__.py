"""The small hybrid-attention engine (KDA-style linear + MLA / GQA / SWA) on CPU.

Public API: EngineConfig, ByteTokenizer, Engine, PrefillResult, DecodeSeq, SamplingParams,
LayerKV, SequenceKV, and the numpy wire helpers layer_kv_to_arrays / layer_kv_from_arrays.
"""

from prfaas.engine.engine import DecodeSeq, Engine, PrefillResult
from prfaas.engine.kv import LayerKV, SequenceKV
from prfaas.engine.sampling import SamplingParams, sample
from prfaas.engine.wire_adapter import layer_kv_from_arrays, layer_kv_to_arrays
from prfaas.models.engine_config import EngineConfig
from prfaas.models.tokenizer import ByteTokenizer

__all__ = [
    "ByteTokenizer",
    "DecodeSeq",
    "Engine",
    "EngineConfig",
    "LayerKV",
    "PrefillResult",
    "SamplingParams",
    "SequenceKV",
    "layer_kv_from_arrays",
    "layer_kv_to_arrays",
    "sample",
]
