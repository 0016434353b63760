"""The router program: OpenAI API, dispatch, membership, metrics, the workers' backends."""
