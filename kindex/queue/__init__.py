"""Queue mode (extra ``kindex[queue]``): the HTTP service's steps on Celery workers over Redis.

``kindex serve --queue redis://…`` publishes every step instead of running it; ``kindex worker --queue redis://…``
runs them. Task records, the one-writer lease per KB, cancel flags and shared model limits live in the same Redis,
so every API replica answers for every task. Modules: :mod:`~kindex.queue.jobs` (records, lease, cancel),
:mod:`~kindex.queue.broker` (the Celery app), :mod:`~kindex.queue.worker` (``kindex worker``),
:mod:`~kindex.queue.ratelimit` (shared model limits). Importing this package imports neither Celery nor Redis.
"""
