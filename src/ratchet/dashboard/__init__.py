"""``ratchet dashboard``: a live, read-only web page over runs' ledgers.

Runs table (status, task, policy kind, refiners, start → incumbent, budget burnt, last activity), one run's page
(curves per generation, gate decisions, env-step breakdown, refiner allocation, failure modes with their GIFs,
parameter changes, code changes and the lineage of programs, LLM usage, training jobs, correction rounds) and two
runs side by side. It polls the ledgers, so runs being written (SQLite run directories or a PostgreSQL database)
gain generations on the page without a reload. Served on loopback with a token in the URL; no CDN (uPlot is
bundled). Built on Starlette and uvicorn.

    from ratchet.dashboard import DashboardServer

    server = DashboardServer("runs")
    print(server.url)
    server.run()  # or server.start() ... server.stop()
"""

from __future__ import annotations

from ratchet.dashboard.app import Dashboard, DashboardServer, create_app
from ratchet.dashboard.views import RunPage, RunSource, run_row

__all__ = ["Dashboard", "DashboardServer", "RunPage", "RunSource", "create_app", "run_row"]
