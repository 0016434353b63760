"""The paper's throughput model (Eqs 1-8), its grid search, and egress projections. No clock."""
