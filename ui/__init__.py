"""The Streamlit app over the store (`tracemill ui`): trace explorer, failure modes, the human review queue, datasets,
models and deployments, behind sign-in with roles. Nothing imports this package; it imports Streamlit only in the
modules the app runs."""
