"""The Celery application of queue mode: Redis as broker, messages acknowledged only after the step ends.

Settings measured in ``docs/research/queue-mode-celery-redis.md``:
- ``task_acks_late`` with ``prefetch 1``: a worker killed mid-step leaves its message unacknowledged, and Redis
  hands it to another worker once ``visibility_timeout`` has passed since delivery;
- kombu looks for such messages only every ``unacked_restore_interval`` × ``unacked_restore_throttle`` seconds
  (100 s by default); 5 × 1 here, so a dead worker's step restarts within the visibility timeout plus 5 s;
- a step longer than the visibility timeout is delivered a second time while it runs: the lease
  (:mod:`kindex.queue.jobs`) makes that copy wait its turn instead of running beside the first.
"""

from __future__ import annotations

import logging

import redis.exceptions
from celery import Celery
from kombu.transport import redis as kombu_redis

log = logging.getLogger("kindex.worker")

QUEUE = "kindex"
TASK = "kindex.step"
DEFAULT_REDELIVER_AFTER = 120.0
"""Seconds before an unacknowledged step (its worker died) is delivered to another worker."""


class _QoS(kombu_redis.QoS):
    # When a worker's broker connection drops, kombu pushes the messages of the steps still running back to the
    # queue as it closes the old channel: a duplicate of each (the lease makes it wait), and with kombu 5.7 a crash
    # of the whole worker when the old channel can no longer open a connection ("'NoneType' object has no
    # attribute 'hostname'", seen when Redis restarts under a running step). The running step goes on and is
    # acknowledged when it ends; a worker that dies leaves its messages to the visibility timeout, as designed.
    restore_at_shutdown = False

    # A step that ends after its connection was replaced is acknowledged on the old channel, which can no longer
    # reach Redis (kombu 5.7 crashes the worker there too). Its message stays in Redis's unacknowledged set; once
    # the visibility timeout has passed it is delivered again, and that copy finds the step ended and stops.
    def ack(self, delivery_tag: str) -> None:
        if self.channel.connection is None:
            self._delivered.pop(delivery_tag, None)
            return
        try:
            super().ack(delivery_tag)  # type: ignore[no-untyped-call]
        except redis.exceptions.ResponseError as exc:
            # Redis refusing writes (out of memory under `noeviction`) ended the whole worker here ("Unrecoverable
            # error"). The message is left unacknowledged, as above: delivered again after the visibility timeout,
            # its copy finds the step ended and stops.
            log.warning("could not acknowledge a finished step (%s): it will be delivered again, and stop", exc)
            self._delivered.pop(delivery_tag, None)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if self.channel.connection is None:
            self._delivered.pop(delivery_tag, None)
            return
        super().reject(delivery_tag, requeue=requeue)  # type: ignore[no-untyped-call]


class _Channel(kombu_redis.Channel):
    QoS = _QoS


class Transport(kombu_redis.Transport):
    """kombu's Redis transport without the restore of unacknowledged messages when a channel closes."""

    Channel = _Channel


def make_app(url: str, *, redeliver_after: float = DEFAULT_REDELIVER_AFTER) -> Celery:
    """The Celery app on the Redis at ``url``; the API replicas publish with it, the workers consume."""
    app = Celery("kindex", broker=url, set_as_current=False)
    app.conf.update(
        broker_transport=f"{__name__}:Transport",
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,  # task records are kindex's own (jobs.py), readable from any replica
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        # A step keeps running through a broker reconnect: its lease and fenced writes keep it the only writer.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_transport_options={
            "visibility_timeout": redeliver_after,
            "unacked_restore_interval": min(5.0, redeliver_after / 2),
            "unacked_restore_throttle": 1,
            # The lock kombu takes to restore unacknowledged messages: a worker cut off while holding it stopped
            # every redelivery for kombu's default five minutes.
            "unacked_mutex_expire": int(min(60.0, max(10.0, redeliver_after / 2))),
            "socket_timeout": 10,
            "socket_connect_timeout": 5,
            "health_check_interval": 25,
        },
        # A publish during a Redis outage fails after about a second instead of hanging the request.
        task_publish_retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_step": 0.2},
    )
    return app
