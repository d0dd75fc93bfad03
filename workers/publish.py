"""Publishing phase chains to the GPU workers' queues, through the Celery app of the
publisher's own settings.

The planner publishes through :func:`publisher` of its settings (held by
:attr:`makespan.workers.tick.context.TickEnv.celery`), never through the environment-driven
app of :mod:`makespan.workers.tasks` (``MAKESPAN_REDIS_URL``, ``MAKESPAN_KEY_PREFIX``): a
planner built in-process for another Redis or key prefix (tests, users embedding makespan)
must not leave its messages under the environment's ``makespan:celery:`` keys, where no GPU
worker of its own consumes them. The tasks are named here (:data:`PHASE_TASK_NAMES`,
:data:`WARM_JOB_TASK`); a publishing app declares them without their code
(:func:`publisher`), so this module imports no task code (nor the user workload modules
:mod:`makespan.workers.tasks` loads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery, chain
from celery.utils import uuid

from makespan.celery_app import create_celery
from makespan.errors import PhaseError
from makespan.settings import Settings
from makespan.workers.phases import JOB_PHASES, RESTORE_PHASES, PhaseContext

PHASES = ("evict", "start_endpoint", "execute", "clear", "restore")
"""Every phase that runs as its own Celery task, in a job's or a restore's chain."""

PHASE_TASK_NAMES = {phase: f"makespan.{phase}" for phase in PHASES}
"""Phase -> the name of its Celery task (:mod:`makespan.workers.tasks` registers them)."""

WARM_JOB_TASK = "makespan.warm_job"
"""The task that runs a warm job's phases in one message (:func:`makespan.workers.tasks.warm_job`)."""

ARGS_SHOWN = ("job_id", "lease_id", "token", "kind", "endpoint", "gpus", "priority")
"""The phase context's fields a task message's ``argsrepr`` shows (:func:`dispatch`)."""

PUBLISHERS_KEPT = 32
"""Most publishing apps :func:`publisher` keeps (the most recently asked for). One an
older holder still uses keeps working; it is only built again when asked for anew."""

_publishers: OrderedDict[str, Celery] = OrderedDict()
_publishers_lock = threading.Lock()


def publisher(settings: Settings) -> Celery:
    """The Celery app that publishes for ``settings``: :func:`makespan.celery_app.create_celery`
    of them, with the phase tasks declared by name only (:func:`_declare_tasks`), built once
    per distinct settings (equal settings share one app and its broker connection pool).
    Its messages go to ``settings.redis_url`` under ``{settings.key_prefix}:celery:``,
    whatever the environment (``MAKESPAN_*``) says. Thread-safe; building it opens no
    connection (kombu connects on the first publish).

    Raises:
        ValidationError: a Sentinel ``settings.redis_url`` that does not parse (one that
            passed :class:`~makespan.settings.Settings`' own check always does).
    """
    key = repr(settings)  # Settings is frozen but holds a dict (unhashable); its repr names every field
    with _publishers_lock:
        app = _publishers.get(key)
        if app is not None:
            _publishers.move_to_end(key)
            return app
        app = create_celery(settings)
        _declare_tasks(app)
        _publishers[key] = app
        while len(_publishers) > PUBLISHERS_KEPT:
            _publishers.popitem(last=False)
        return app


def _declare_tasks(app: Celery) -> None:
    """Register the phase tasks and ``warm_job`` on the publishing ``app`` under their
    names and options, with a body that refuses to run: their code runs only on a GPU
    worker (:mod:`makespan.workers.tasks`). Declared, a task is published as the GPU
    worker's app would publish it (``Task.apply_async``: the task's options merged), and
    OpenTelemetry's Celery hooks, which look the sender's name up among the current app's
    tasks, find it: its producer span then lasts until the message is written."""
    def runs_on_a_gpu_worker(task: Any, ctx: dict) -> str:
        raise PhaseError(f"{task.name} runs on a GPU worker (makespan.workers.tasks), not where it is published")

    for name in (*PHASE_TASK_NAMES.values(), WARM_JOB_TASK):
        app.task(name=name, bind=True, acks_late=True, ignore_result=True, shared=False, lazy=False)(
            runs_on_a_gpu_worker)


def dispatch(app: Celery, ctx: PhaseContext, queue: str, warm: bool = False, producer: Any = None) -> None:
    """Send the phase chain of ``ctx`` to ``queue`` through ``app`` (a :func:`publisher`:
    its settings' Redis and key prefix); a warm job as one ``warm_job`` task. ``warm``: the lease script's answer (``Lease.warm``: every GPU held the
    job's instance when the lease was published); a job sent cold that is in fact warm only
    records empty evict and start_endpoint phases. ``producer``: :func:`publish_batch`'s
    producer of ``app`` (its messages go out together when the block ends; a warm job's
    then goes through :func:`send_in_batch`, not ``apply_async``); None: one from
    ``app``'s pool.

    Raises:
        Exception: whatever kombu raises when the broker is away (callers log it and let
            the lease expire, :func:`makespan.workers.starts.send`).
    """
    payload = ctx.__dict__.copy()
    # What Flower and the worker's log show as the task's arguments: the fields that name the
    # job, not the whole context (Celery's own saferepr of it cost ~0.15 ms per job in the planner).
    shown = {"argsrepr": repr(({name: payload[name] for name in ARGS_SHOWN},)), "kwargsrepr": "{}"}
    if ctx.kind == "job" and warm:
        task = app.tasks[WARM_JOB_TASK]
        if producer is not None and _sends_plainly(app, task):
            send_in_batch(app, task, (payload,), queue, producer, shown)
        else:
            task.apply_async(args=(payload,), queue=queue, producer=producer, **shown)
        return
    phases = JOB_PHASES if ctx.kind == "job" else RESTORE_PHASES
    tasks = app.tasks
    chain(*[tasks[PHASE_TASK_NAMES[phase]].si(payload).set(queue=queue, **shown) for phase in phases],
          app=app).apply_async(producer=producer)


def send_in_batch(app: Celery, task: Any, args: tuple, queue: str, producer: Any, shown: dict[str, str]) -> None:
    """Send one message of ``task`` (a task of ``app``, :func:`_declare_tasks`) with
    ``args`` to ``queue`` through ``producer`` of :func:`publish_batch`: the message, its
    ``task-sent`` event and the publish signals exactly as ``task.apply_async(args=args,
    queue=queue, producer=producer, **shown)`` sends them (Celery's own
    ``app.amqp.create_task_message`` and ``send_task_message`` with the options
    ``apply_async`` and ``send_task`` would pass them; ``tests/workers/test_publish_path.py``
    compares the two), less what a planner's message needs none of: the result object,
    the router, the argument check (one positional argument), the producer pool.

    In the batch, a publish writes nothing until the block ends, so it has nothing to
    retry: it is sent without kombu's retry wrapper (``retry=False``), and ``queue`` is
    declared only when the producer's connection has not declared it yet (kombu's own
    cache, ``Connection.declared_entities``; then with Celery's retry policy), instead of
    kombu checking that cache through a copy of the queue bound to the channel at every
    publish. Only for a task :func:`_sends_plainly` accepts (:func:`dispatch` checks)."""
    amqp = app.amqp
    queue_entity = amqp.queues[queue]  # Celery's Queue of that name (created on first use, as its router does)
    task_id = uuid()
    message = amqp.create_task_message(
        task_id, task.name, args=args, kwargs=None, retries=0, reply_to=app.thread_oid, time_limit=task.time_limit,
        soft_time_limit=task.soft_time_limit, create_sent_event=app.conf.task_send_sent_event,
        ignore_result=task.ignore_result, replaced_task_nesting=0, **shown)
    declared = hash(queue_entity) in producer.connection.declared_entities
    amqp.send_task_message(producer, task.name, message, queue=queue_entity, retry=False if declared else None,
                           declare=[] if declared else None, **_exec_options(task), **shown)


def _sends_plainly(app: Celery, task: Any) -> bool:
    """Whether ``task.apply_async`` would send what :func:`send_in_batch` sends: ``app``
    publishes (not eager), no Celery task runs here (its message would name it as parent),
    and ``task`` has no expiry (``send_task`` turns one into a message property) and no
    router applies (``task_routes`` unset)."""
    return (not app.conf.task_always_eager and app.current_worker_task is None and task.expires is None
            and not app.conf.task_routes)


def _exec_options(task: Any) -> dict[str, Any]:
    """The options ``Task.apply_async`` reads from ``task``'s attributes and ``send_task``
    hands to ``send_task_message`` (Celery's ``extract_exec_options``), less the queue
    (:func:`send_in_batch` names it) and those ``send_task`` takes for the message itself
    (``expires``, ``time_limit``, ``soft_time_limit``)."""
    return {name: getattr(task, name, None) for name in _EXEC_OPTIONS}


_EXEC_OPTIONS = ("routing_key", "exchange", "priority", "serializer", "delivery_mode", "compression", "immediate",
                 "mandatory")


@contextmanager
def publish_batch(app: Celery) -> Iterator[Any]:
    """A kombu producer of ``app`` whose publishes (the task messages and their
    ``task-sent`` events) are buffered and written to Redis in one pipeline when the block
    ends (kombu's ``Producer.batch``). A failed write raises when the block ends and loses
    the whole batch; each job's lease then expires and is reclaimed, as after a failed send."""
    with app.producer_or_acquire() as producer, producer.batch():
        yield producer
