"""Emulated hardware: a scenario's heterogeneous deployment run live on one host.

Workers keep their real HTTP control plane, router, policies, batching and KV transport; only
the compute is replaced by sleeps whose lengths come from the scenario's hardware profiles,
and the KV by deterministic payloads of the scenario's geometry, all in scaled units
(`scales.Scales`) that keep every stage's capacity ratio. Modules: `scales` (the unit mapping),
`layout` (emulated layers and their bytes), `engine` (the engine, engine/base.py's interface),
`backend` (the `engine: emulated` backend, serve/engines.py), `topology` (topologies from a
scenario). The live-vs-simulator experiments that run on it are in prfaas.experiments.
"""
