"""Reports: a self-contained HTML page per run, plots, and episode videos."""
