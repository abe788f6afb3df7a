"""Reports exported from a recording (HTML, Markdown, JSON, Perfetto, CSV). Reads only the file."""
