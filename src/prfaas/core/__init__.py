"""Shared types, errors and units. Imports nothing else from prfaas."""
