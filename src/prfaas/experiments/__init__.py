"""Live-vs-simulator experiments on the emulated engine: `reproduce --live` (live.py), the
link outage (outage.py) and link fluctuation (fluctuation.py) runs, the probes that judge a
run sustainable (probe.py), the runs themselves (runs.py), their reports and plots."""
