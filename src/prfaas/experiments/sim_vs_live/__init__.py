"""`prfaas sim-vs-live`: one Poisson workload, at two or more loads, through a topology's live
deployment and through the simulator built from its measured profile, compared per request
and against a baseline with no simulator in it.

The two sides share the workload (arrival times, prompt lengths, output lengths) and the policy
builder (`serve.router.service.build_policy(topology)`: the live router and the simulator each
hold one such object), nothing else:
- live (live.py): the topology is started (free ports); after unmeasured warm-up requests, lone
  requests at the profile's lengths measure each route on the idle deployment (the idle
  points); then `bench.loadgen` replays each load's arrivals with fresh random token-id prompts
  (no prefix hit), streaming, greedy, ignore_eos. TTFT is the client's (sent -> first streamed
  token), E2E the client's (sent -> last byte); the route is the router's first decision.
- sim (simulated.py): `Simulator` on the system the profile describes, calibrated on the idle
  points only (calibration.py): each route's prefill time scaled by the deployment's own
  measured prefill time over the profile's T(l) (the instance is busy that long: the
  connector's work runs inside the prefill), S_kv(l) fitted to the bytes the connector
  counted on the wire, and each route's remaining fixed overhead (hops, the decoder's first
  step) added to the first token. TTFT is `kv_ready_s - arrival_s` plus that overhead.
- baseline (baseline.py): no simulator at all: per route, the idle TTFT interpolated by prompt
  length. It knows everything the idle points measured and nothing of queueing.
The loads are fixed fractions of the planner's capacity for this deployment at the topology's t
(capacity.py, on the calibrated system), chosen before any run. compare.py turns the two sides
into the figures and the verdict: the simulator "predicts" a load only where the upper end of
its TTFT MAPE's bootstrap 90% interval is below the baseline's MAPE, on at least
`MIN_REQUESTS` requests; the run predicts when every load does and one of them is loaded.
"""
