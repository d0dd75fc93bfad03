"""``makespan dashboard``: the fleet live in a browser (read-only).

:mod:`makespan.dashboard.state` reads one JSON snapshot from Redis;
:mod:`makespan.dashboard.app` serves it (Starlette + uvicorn) with the page in
``static/`` (shipped in the package, nothing fetched from the internet), refreshed by
server-sent events. See docs/dashboard.md.
"""
