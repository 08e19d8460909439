"""The package version, in one place (pyproject.toml reads it; the package re-exports it)."""

__version__ = "0.2.0.dev0"
