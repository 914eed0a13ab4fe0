"""The Streamlit app: trace explorer, failure modes, review queue."""
