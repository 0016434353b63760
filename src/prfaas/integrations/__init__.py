"""Integrations of prfaas with other serving engines (each needs its own optional extra)."""
