"""Model geometry (KV bytes), hardware, and prefill/decode time profiles. No torch."""
