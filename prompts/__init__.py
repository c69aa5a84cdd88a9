"""Jinja2 prompt templates, shipped inside the wheel as ``kindex.prompts`` (see pyproject.toml)."""
