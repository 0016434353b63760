"""Routing and control policies: written once, no torch/sockets/clock, used by sim and serve."""
