"""The HTTP service (SPEC §7): the reindex steps, BuildContext, skills and tasks, for chat backends in any language.

Each agent's KB is ``<kb-root>/<agent_id>/``. Every route but ``/healthz`` needs ``Authorization: Bearer <token>``
when a token is configured; without one, the app serves this machine only. Long steps run as tasks in worker
threads: ``wait=true`` (default) answers when the step is done, ``wait=false`` answers 202 with a task id.

Modules: :mod:`~kindex.server.app` (``create_app``), :mod:`~kindex.server.routes`, :mod:`~kindex.server.state`
(shared state and guards), :mod:`~kindex.server.tasks`, :mod:`~kindex.server.schemas` (request, task and error
bodies), :mod:`~kindex.server.errors` (error answers, body limit), :mod:`~kindex.server.logs` (JSON lines).
"""

from kindex.jsonlog import LOG_CONFIG, JsonLines
from kindex.server.app import create_app

__all__ = ["LOG_CONFIG", "JsonLines", "create_app"]
