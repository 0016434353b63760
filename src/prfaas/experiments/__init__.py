"""Live-vs-simulator experiments on the emulated engine: reproduce --live, outage, fluctuation."""
