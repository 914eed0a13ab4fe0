from tracemill.ui.traces_page import render

render()
