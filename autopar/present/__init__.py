"""Presentation of a `Plan`: the text summary, the HTML report and the DOT drawing."""
