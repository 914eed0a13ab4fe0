"""The reviser sidecar: an OpenAI-compatible proxy that fixes tool calls."""
