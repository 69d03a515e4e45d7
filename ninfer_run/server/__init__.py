"""HTTP server: OpenAI-compatible API over the engine (Anthropic API and metrics are next)."""
