"""Command groups of the ``kindex`` CLI that live outside ``kindex.cli``."""
