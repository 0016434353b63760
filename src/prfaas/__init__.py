"""prfaas: Prefill-as-a-Service for hybrid-attention LLMs (plan, simulate, serve)."""

__version__ = "0.1.0"
