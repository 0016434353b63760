"""Input-length distributions, arrival processes and trace readers. No clock, no global RNG."""
