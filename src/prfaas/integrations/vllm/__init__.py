"""prfaas behind real vLLM instances (the `vllm` extra; docs/vllm.md).

`connector.PrfaasConnector` is the KV connector vLLM loads (`kv_connector_module_path`);
`model_builder` makes tiny real-architecture checkpoints locally; `server` starts and stops
vLLM's OpenAI server with that connector. Importing this package imports no vLLM.
"""
