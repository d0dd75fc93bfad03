"""Checks a GPU worker makes as it starts (Celery ``worker_init``), before it consumes.

Settings whose leases one blocked Redis call would lose get a warning
(:func:`makespan.settings.lease_renewal_warning`); a Redis whose ``maxmemory-policy``
evicts is refused, and so are credentials Redis (or its Sentinels) refuses
(:class:`makespan.errors.RedisAuthFailed`: waiting cannot help).

:func:`makespan.celery_app.create_celery` imports this module, so every Celery worker of
makespan's app runs them. A failed check ends the worker with exit code
:data:`EXIT_REFUSED` (not 0: a restart-on-failure supervisor must see it), after printing
the reason once to stderr.

A Redis that does not answer at start is checked later: a daemon thread asks every
:data:`RECHECK_INTERVAL_S` until Redis answers once, and on an evicting policy (or refused
credentials) stops the worker with the same exit code (Celery's warm shutdown, ``celery.worker.state.should_stop``;
a worker still alive :data:`REFUSAL_BACKSTOP_S` after the shutdown grace ends at once).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

import redis
from celery import signals

from makespan.errors import RedisAuthFailed, RedisConfigError
from makespan.redis_conn import EXIT_REFUSED, check_eviction_policy, connect, credentials_refused
from makespan.settings import Settings, lease_renewal_warning, liveness_warning, retention_warning

log = logging.getLogger("makespan.startup")

RECHECK_INTERVAL_S = 2.0  # how often the policy is asked again while Redis did not answer, s
REFUSAL_BACKSTOP_S = 10.0  # past the shutdown grace: a late refusal still running ends with os._exit, s


def _say_refused(error: RedisConfigError | RedisAuthFailed) -> None:
    """The refusal, once, on the process's own stderr (fd 2: Celery may have replaced
    ``sys.stderr`` with a logging proxy)."""
    print(f"makespan gpu-worker: {error}", file=sys.__stderr__ or sys.stderr, flush=True)


def _check_once(settings: Settings) -> None:
    """One :func:`check_eviction_policy` on a fresh connection.

    Raises:
        RedisConfigError: the policy evicts and no override is set.
        RedisAuthFailed: Redis (or its Sentinels) refused the credentials.
        redis.RedisError: Redis did not answer."""
    r = connect(settings.redis_url, settings=settings)
    try:
        check_eviction_policy(r, settings, process="gpu-worker")
    except redis.RedisError as e:
        refused = credentials_refused(settings.redis_url, e)
        if refused is not None:
            raise refused from None
        raise
    finally:
        r.close()


def _stop_refused(settings: Settings) -> None:
    """Stop a running worker with :data:`EXIT_REFUSED`: Celery's warm shutdown (its consumer
    and its connection retry both poll ``should_stop``), and, should that not end the
    process within the shutdown grace and :data:`REFUSAL_BACKSTOP_S`, ``os._exit``."""
    from celery.worker import state

    state.should_stop = EXIT_REFUSED
    backstop = threading.Timer(settings.shutdown_grace_s + REFUSAL_BACKSTOP_S, os._exit,
                               args=(EXIT_REFUSED,))
    backstop.daemon = True
    backstop.start()


def recheck_until_answered(settings: Settings, stop: threading.Event, interval_s: float = RECHECK_INTERVAL_S) -> None:
    """Ask Redis for its policy every ``interval_s`` seconds until it answers once (or
    ``stop`` is set): an accepted policy ends the loop; an evicting one without the
    override (or refused credentials) prints the refusal and stops the worker
    (:func:`_stop_refused`)."""
    while not stop.wait(interval_s):
        try:
            _check_once(settings)
        except (RedisConfigError, RedisAuthFailed) as e:
            _say_refused(e)
            _stop_refused(settings)
            return
        except redis.RedisError:
            continue
        log.info("gpu-worker: Redis answers now; maxmemory-policy checked")
        return


@signals.worker_init.connect(weak=False)
def _check_redis_at_worker_start(**_kw) -> None:
    """Refuse to start on an evicting Redis (:func:`check_eviction_policy`) or refused
    credentials. A Redis that does not answer is checked again from a daemon thread
    (:func:`recheck_until_answered`) and the worker is stopped when the policy evicts or
    the credentials are refused."""
    settings = Settings.from_env()
    for timing in (lease_renewal_warning(settings), liveness_warning(settings), retention_warning(settings)):
        if timing is not None:
            log.warning("gpu-worker: %s", timing)
    try:
        _check_once(settings)
    except (RedisConfigError, RedisAuthFailed) as e:
        _say_refused(e)
        raise SystemExit(EXIT_REFUSED) from e
    except redis.RedisError as e:
        log.warning("gpu-worker: maxmemory-policy not checked yet, Redis did not answer (asking again every "
                    "%.0f s): %s", RECHECK_INTERVAL_S, e)
        threading.Thread(target=recheck_until_answered, args=(settings, threading.Event()),
                         name="makespan-policy-recheck", daemon=True).start()
