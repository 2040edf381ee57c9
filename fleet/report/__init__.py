"""A run's report: computed once (model), cut into sections (sections), laid out as the text
summary (text), Markdown (markdown) and HTML with plots (html, plots, svg); two runs: compare.
Tables print through one writer (table) with one set of headers (columns)."""
