"""`python -m prfaas` runs the CLI."""

from prfaas.cli import main

main()
