"""``python -m kindex.cli``: the same as the ``kindex`` command."""

from kindex.cli import main

main()
