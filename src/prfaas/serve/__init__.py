"""The live PrfaaS service: prefill and decode workers, the OpenAI-compatible router, the
launcher. See docs/serving.md for the control protocol and the request path."""
