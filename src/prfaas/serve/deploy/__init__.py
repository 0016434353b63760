"""Deployment: launcher, supervisor, process entry point, network namespaces, faults, demo."""
