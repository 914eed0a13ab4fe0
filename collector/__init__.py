"""OTLP/HTTP receiver: decodes spans, extracts and verifies tool calls, stores them."""
