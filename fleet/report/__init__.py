"""A run's report: computed once (model, from figures, provenance and feature_matrix), cut into
sections (sections, with the lines under its tables from parity_lines and perf_lines), laid out as
the text summary (text), Markdown (markdown) and HTML with plots (html, plots, svg); two runs:
compare. Tables print through one writer (table) with one set of headers (columns)."""
