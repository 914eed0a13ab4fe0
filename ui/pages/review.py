from tracemill.ui.review_page import render

render()
