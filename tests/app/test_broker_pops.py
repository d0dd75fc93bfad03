"""The broker's consumer pops a burst in one round trip and hands the acks made on its
event loop to a writer thread (:mod:`makespan.broker`): on a real Redis, through kombu's
own consumer API."""

from __future__ import annotations

import logging
import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.asynchronous import Hub, set_event_loop

from makespan.broker import Transport
from makespan.redis_conn import connect
from tests.live import wait_for


@pytest.fixture
def broker(redis_url, prefix):
    """A kombu connection on makespan's transport whose keys live under this test's prefix."""
    conn = Connection(redis_url, transport=Transport, transport_options={"global_keyprefix": f"{prefix}:"})
    try:
        yield conn
    finally:
        conn.release()


@contextmanager
def _as_the_event_loop_thread() -> Iterator[None]:
    """This thread runs kombu's event loop, as Celery's consumer thread does."""
    hub = Hub()
    set_event_loop(hub)
    try:
        hub._loop_thread = threading.get_ident()
        yield
    finally:
        set_event_loop(None)
        hub.close()


def _publish(conn: Connection, queue: Queue, count: int) -> None:
    with Producer(conn.channel()) as producer:
        for number in range(count):
            producer.publish({"n": number}, exchange=queue.exchange, routing_key=queue.routing_key,
                             declare=[queue], serializer="json")


def _unacked(redis_url: str, prefix: str) -> set[str]:
    client = connect(redis_url)
    try:
        return set(client.hkeys(f"{prefix}:unacked"))
    finally:
        client.close()


def test_one_pop_takes_as_many_messages_as_the_prefetch_credit(broker, redis_url, prefix):
    queue = Queue("burst", Exchange("burst"), "burst")
    _publish(broker, queue, 6)
    seen: list[tuple[int, set[str]]] = []
    channel = broker.channel()

    def on_message(body, message):
        # its unacked record is in Redis before the consumer sees it (as with kombu's BRPOP)
        seen.append((body["n"], _unacked(redis_url, prefix)))
        assert message.delivery_tag in seen[-1][1]

    with Consumer(channel, [queue], callbacks=[on_message]):
        channel.basic_qos(0, 4, False)
        broker.drain_events(timeout=2)  # one read of the consumer's connection
        assert [number for number, _ in seen] == [0, 1, 2, 3]  # BRPOP: [0]
        assert not channel.qos.can_consume()
        assert len(_unacked(redis_url, prefix)) == 4
        assert connect(redis_url).llen(f"{prefix}:burst") == 2  # the rest waits for credit


def test_a_consumer_without_acks_pops_one_at_a_time(broker, redis_url, prefix):
    queue = Queue("noack", Exchange("noack"), "noack")
    _publish(broker, queue, 3)
    seen: list[int] = []
    channel = broker.channel()
    with Consumer(channel, [queue], callbacks=[lambda body, _m: seen.append(body["n"])], no_ack=True):
        channel.basic_qos(0, 4, False)
        broker.drain_events(timeout=2)
    assert seen == [0]
    assert _unacked(redis_url, prefix) == set()


def test_acks_on_the_event_loop_are_written_by_another_thread(broker, redis_url, prefix):
    queue = Queue("acks", Exchange("acks"), "acks")
    _publish(broker, queue, 3)
    messages = []
    channel = broker.channel()
    with Consumer(channel, [queue], callbacks=[lambda _b, message: messages.append(message)]):
        channel.basic_qos(0, 3, False)
        broker.drain_events(timeout=2)
        assert len(messages) == 3 and len(_unacked(redis_url, prefix)) == 3
        with _as_the_event_loop_thread():
            writes = []
            real_write = channel.qos.write_acks
            channel.qos.write_acks = lambda tags: (writes.append(list(tags)), real_write(tags))
            messages[0].ack()
            messages[1].ack()
            assert channel.qos.can_consume()  # the slots are free at once
            wait_for(lambda: _unacked(redis_url, prefix) == {messages[2].delivery_tag}, 10,
                     "the ack writer's write")
            assert sum(writes, []) == [messages[0].delivery_tag, messages[1].delivery_tag]
            assert channel.qos._ack_writer._thread is not threading.current_thread()
            worker = threading.Thread(target=messages[2].ack)  # any other thread: written at once
            worker.start()
            worker.join()
            assert _unacked(redis_url, prefix) == set()


def test_acks_pending_when_the_channel_closes_are_written(broker, redis_url, prefix):
    queue = Queue("closing", Exchange("closing"), "closing")
    _publish(broker, queue, 2)
    messages = []
    channel = broker.channel()
    consumer = Consumer(channel, [queue], callbacks=[lambda _b, message: messages.append(message)])
    consumer.consume()
    channel.basic_qos(0, 2, False)
    broker.drain_events(timeout=2)
    with _as_the_event_loop_thread():
        for message in messages:
            message.ack()
    channel.close()  # kombu restores what is still unacked; the acked ones must not come back
    assert _unacked(redis_url, prefix) == set()
    assert connect(redis_url).llen(f"{prefix}:closing") == 0


def test_a_credit_lowered_while_the_pop_waits_is_kept_and_the_rest_goes_back_first_in_line(broker, redis_url, prefix):
    queue = Queue("shrink", Exchange("shrink"), "shrink")
    _publish(broker, queue, 4)
    seen: list[int] = []
    channel = broker.channel()
    with Consumer(channel, [queue], callbacks=[lambda body, _m: seen.append(body["n"])]):
        channel.basic_qos(0, 4, False)
        broker.transport.cycle.on_poll_start()  # the pop goes out with a credit of 4; its reply is on its way
        channel.basic_qos(0, 1, False)  # meanwhile Celery lowers the prefetch (pool_shrink, an ETA task due)
        broker.drain_events(timeout=2)
        assert seen == [0]  # all four were delivered before
        assert len(_unacked(redis_url, prefix)) == 1
        assert connect(redis_url).llen(f"{prefix}:shrink") == 3
        seen.clear()
        channel.basic_qos(0, 4, False)  # a credit of 3 again (one message is still unacked)
        broker.drain_events(timeout=2)
        assert seen == [1, 2, 3]  # in order, next in line


def test_a_limit_lifted_while_the_pop_waits_delivers_all_it_took(broker, redis_url, prefix):
    queue = Queue("lifted", Exchange("lifted"), "lifted")
    _publish(broker, queue, 3)
    seen: list[int] = []
    channel = broker.channel()
    with Consumer(channel, [queue], callbacks=[lambda body, _m: seen.append(body["n"])]):
        channel.basic_qos(0, 4, False)
        broker.transport.cycle.on_poll_start()
        channel.basic_qos(0, 0, False)  # no limit
        broker.drain_events(timeout=2)
        assert seen == [0, 1, 2]


def test_messages_popped_behind_one_whose_delivery_raised_go_back_to_the_queue_at_once(broker, redis_url, prefix):
    """... first in line and in order, ahead of the messages the pop did not take (a review
    found them put back behind the whole queue, last first)."""
    queue = Queue("raise", Exchange("raise"), "raise")
    _publish(broker, queue, 6)
    channel = broker.channel()

    def on_message(body, message):
        raise RuntimeError("the consumer's callback failed")

    consumer = Consumer(channel, [queue], callbacks=[on_message])
    consumer.consume()
    channel.basic_qos(0, 3, False)
    with pytest.raises(RuntimeError):
        broker.drain_events(timeout=2)
    assert len(_unacked(redis_url, prefix)) == 1  # the one delivered; the two behind it waited 6 h here

    def in_pop_order() -> list[int]:  # the pops read the list from its right end
        raw = connect(redis_url).lrange(f"{prefix}:raise", 0, -1)
        return [json.loads(base64.b64decode(json.loads(m)["body"]))["n"] for m in reversed(raw)]

    assert in_pop_order() == [1, 2, 3, 4, 5]
    channel.close()  # kombu restores what it delivered, first in line too
    assert _unacked(redis_url, prefix) == set()
    assert in_pop_order() == [0, 1, 2, 3, 4, 5]


def test_an_undecodable_message_raises_as_with_brpop_without_taking_the_others_popped_with_it(broker, redis_url,
                                                                                              prefix):
    queue = Queue("bad", Exchange("bad"), "bad")
    _publish(broker, queue, 2)
    connect(redis_url).lpush(f"{prefix}:bad", "not json")  # popped last
    seen: list[int] = []
    channel = broker.channel()
    with Consumer(channel, [queue], callbacks=[lambda body, _m: seen.append(body["n"])]):
        channel.basic_qos(0, 3, False)
        with pytest.raises(ValueError):
            broker.drain_events(timeout=2)
        assert seen == [0, 1]  # all three were lost before
        assert len(_unacked(redis_url, prefix)) == 2


def test_an_ack_writer_survives_a_failed_write_and_a_closed_writer_hands_back(broker, redis_url, prefix):
    """A write that raises something other than a Redis error must not end the writer
    thread (acks would pile up until the channel closes); once the writer is stopped, an
    ack is written at once; a writer inherited through a fork (another pid) is replaced."""
    queue = Queue("writer", Exchange("writer"), "writer")
    _publish(broker, queue, 3)
    messages = []
    channel = broker.channel()
    with Consumer(channel, [queue], callbacks=[lambda _b, message: messages.append(message)]):
        channel.basic_qos(0, 3, False)
        broker.drain_events(timeout=2)
        with _as_the_event_loop_thread():
            real_write = channel.qos.write_acks
            calls: list[list[str]] = []

            def flaky_write(tags):
                calls.append(list(tags))
                if len(calls) == 1:
                    raise RuntimeError("a bug in a write")
                real_write(tags)

            channel.qos.write_acks = flaky_write
            messages[0].ack()  # its write raises
            wait_for(lambda: len(calls) == 1, 10, "the first write")
            messages[1].ack()  # the same thread writes this one
            wait_for(lambda: messages[1].delivery_tag not in _unacked(redis_url, prefix), 10, "the second write")
            writer = channel.qos._ack_writer
            writer.pid = -1  # as if inherited through a fork
            messages[2].ack()
            assert channel.qos._ack_writer is not writer
            wait_for(lambda: messages[2].delivery_tag not in _unacked(redis_url, prefix), 10, "the new writer")
            channel.qos._ack_writer.stop()
            _publish(broker, queue, 1)
            broker.drain_events(timeout=2)
            messages[3].ack()  # the writer is stopped: written at once, on this thread
            assert messages[3].delivery_tag not in _unacked(redis_url, prefix)


def test_an_ack_write_whose_connection_closes_under_it_is_tried_again(broker, redis_url, prefix, caplog):
    """At a worker's SIGTERM the channel closed while the ack writer wrote the last acks:
    "1 acks not written to Redis (... Bad file descriptor)", and the message stayed unacked
    for the visibility timeout (new-user check). A connection error is tried once more, on
    a new connection; a second one is logged."""
    import contextlib

    import redis as redis_py

    queue = Queue("reconnect", Exchange("reconnect"), "reconnect")
    _publish(broker, queue, 2)
    messages = []
    channel = broker.channel()
    with Consumer(channel, [queue], callbacks=[lambda _b, message: messages.append(message)]):
        channel.basic_qos(0, 2, False)
        broker.drain_events(timeout=2)
        assert len(_unacked(redis_url, prefix)) == 2
        real = channel.qos.pipe_or_acquire
        broken = {"left": 1}

        class ClosedUnderTheWrite:
            def zrem(self, *_a):
                return self

            def hdel(self, *_a):
                return self

            def execute(self):
                raise redis_py.ConnectionError("Error while reading from 127.0.0.1:6379 : (9, 'Bad file descriptor')")

        @contextlib.contextmanager
        def pipe_or_acquire(*args, **kwargs):
            if broken["left"] > 0:
                broken["left"] -= 1
                yield ClosedUnderTheWrite()
                return
            with real(*args, **kwargs) as pipe:
                yield pipe

        channel.qos.pipe_or_acquire = pipe_or_acquire
        channel.qos.write_acks([messages[0].delivery_tag])
        assert _unacked(redis_url, prefix) == {messages[1].delivery_tag}  # written the second time
        broken["left"] = 2
        with caplog.at_level(logging.WARNING):
            channel.qos.write_acks([messages[1].delivery_tag])  # both tries fail: logged, not raised
        assert "1 acks not written to Redis" in caplog.text
        channel.qos.pipe_or_acquire = real
        channel.qos.write_acks([messages[1].delivery_tag])
        assert _unacked(redis_url, prefix) == set()
