"""`link.compression`'s decision rule, as the live sender imports it (transport/sender.py).

The rule itself lives in models/compression.py, one layer down, so the scenario (and through
it the planner and the simulator) calls the same function the live sender calls."""

from prfaas.models.compression import MODES, CodecSpeed, choose_compression

__all__ = ["MODES", "CodecSpeed", "choose_compression"]
