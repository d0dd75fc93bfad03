"""Checks a GPU worker makes as it starts (Celery ``worker_init``), before it consumes.

:func:`makespan.celery_app.create_celery` imports this module, so every Celery worker of
makespan's app runs them. A failed check ends the worker with exit code
:data:`EXIT_REFUSED` (not 0: a restart-on-failure supervisor must see it), after logging
the reason.
"""

from __future__ import annotations

import logging
import sys

import redis
from celery import signals

from makespan.errors import RedisConfigError
from makespan.redis_conn import EXIT_REFUSED, check_eviction_policy, connect
from makespan.settings import Settings

log = logging.getLogger("makespan.startup")



@signals.worker_init.connect(weak=False)
def _check_redis_at_worker_start(**_kw) -> None:
    """Refuse to start on an evicting Redis (:func:`check_eviction_policy`). A Redis
    that does not answer is left to Celery's own connection retry (logged)."""
    settings = Settings.from_env()
    try:
        r = connect(settings.redis_url, settings=settings)
        try:
            check_eviction_policy(r, settings, process="gpu-worker")
        finally:
            r.close()
    except RedisConfigError as e:
        log.error("%s", e)
        print(f"makespan gpu-worker: {e}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_REFUSED) from e
    except redis.RedisError as e:
        log.warning("gpu-worker: maxmemory-policy not checked, Redis did not answer: %s", e)
