"""The report: Markdown and a self-contained HTML page from a results file."""
