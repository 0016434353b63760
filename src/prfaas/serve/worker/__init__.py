"""The worker programs: prefill and decode workers, the decode batcher, KV shipping."""
