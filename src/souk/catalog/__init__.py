"""The catalog: every worker's rows, replicated to every node that needs them, without consensus.

Each row has one writer (its owner, a worker), versioned by the owner's operation-log sequence;
a replica applies a change only when it is newer than what it holds. See docs/catalog.md.
"""
