from tracemill.ui.datasets_page import render

render()
