"""Shared pydantic models: the one place where the wire shapes of every part are declared."""
