"""The app's entry point, run by `streamlit run` (`tracemill ui` starts it)."""

from tracemill.ui.shell import main

main()
