"""Python's cycle collector held off while kindex builds large tables of short-lived and long-lived objects.

A scan, a table update and a load of a large KB allocate hundreds of thousands of small objects (rows, records,
dicts) that live on. Each time the objects alive grow by a quarter, the collector walks all of them: at 20,000
documents that was 1.5–2 s of a 5–7 s ``doc`` step (now 4.1 s against 5.1 s, in one run). These objects make no
reference cycles worth collecting in the meantime (reference counting frees them), so the collector waits until the
work is done. (A load still pays one walk of what it made once the collector is back: 0.13 s of a first question at
20,000 documents, against 0.18 s of walks during it before, within that call's noise.) It is process-wide: threads
that pause at once share one pause, and the collector comes back when the last of them is done, as it was before the
first (a host application that turned it off keeps it off).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.Lock()
_held = 0
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Hold off Python's cycle collector while the block runs (see the module docstring); nests, and threads may
    overlap."""
    global _held, _was_enabled
    with _LOCK:
        if _held == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _held += 1
    try:
        yield
    finally:
        with _LOCK:
            _held -= 1
            if _held == 0 and _was_enabled:
                gc.enable()
