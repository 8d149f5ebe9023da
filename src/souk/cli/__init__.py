"""The `souk` program: one console script, one subcommand per part."""
