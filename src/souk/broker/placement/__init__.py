"""Market placement: where a new machine goes, decided within one deadline.

`pipeline` holds the `Placer` and the order of its stages (read it first); `stages` the stages
that need no I/O; `offers` and `reservation` the two that talk to workers; `candidates` what a
worker looks like to placement; `policies` how a candidate is scored.
"""
