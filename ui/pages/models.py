from tracemill.ui.models_page import render

render()
