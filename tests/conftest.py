"""Shared pytest configuration.

pytest-django reads DJANGO_SETTINGS_MODULE (console.settings) from pyproject.toml; nothing
runtime-specific lives here yet.
"""
