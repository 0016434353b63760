"""prfaas on a Ray cluster: the topology's router and workers as processes owned by Ray actors
placed by custom resources (deployment.py), and the simulator's independent runs as Ray tasks
(sweep.py). Ray is the optional `ray` extra; nothing outside this package imports it."""
