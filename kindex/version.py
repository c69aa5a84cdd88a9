"""The version of kindex, in one place: the package metadata reads it from here (statically), and what kindex keeps
in a KB's ``.kindex/`` that a new release may read differently is tagged with it."""

__version__ = "0.1.0"
