"""``python -m kindex``: the same as the ``kindex`` command (what people type when the script is not on PATH)."""

from kindex.cli import main

main(prog_name="kindex")
