from tracemill.ui.findings_page import render

render()
