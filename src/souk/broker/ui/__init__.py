"""The operator's dashboard at `/ui`: server-rendered HTML over the broker's own view of the
fleet (its catalog replica), a small script that swaps in fresh HTML when the catalog's change
stream says something changed, and a login that keeps an operator token in an HttpOnly cookie.

`pages` renders and serves, `session` turns the cookie into the bearer token the access
middleware checks, so the dashboard's routes sit in the broker's route table like any other.
"""
