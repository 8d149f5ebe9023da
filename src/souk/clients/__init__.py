"""Typed HTTP clients of souk's APIs, for every part that calls another one.

- `machines`: the public Machines API (the CLI, its deploys, the proxy);
- `workers`: a worker's internal API (the broker);
- `http`: what both share: the pooled session, bodies from the shared models, and errors
  decoded from the shared error body.
"""
