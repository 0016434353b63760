"""Load generation against a running router: trace replay (Mooncake JSONL, scaled for a CPU
model) or synthetic requests, open-loop Poisson arrivals, TTFT/TPOT/throughput reports."""
