from tracemill.ui.failures_page import render

render()
