"""Page scripts `st.navigation` runs; each draws one page from its module in `tracemill.ui`."""
