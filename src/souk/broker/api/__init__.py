"""The public Machines API, Fly-shaped: apps, machines, leases, metadata, plus fleet endpoints
for operators. Handlers are thin: find the machine's worker in the catalog, call it, translate.

`routes.ROUTES` is the one route table; the handlers live in a module per resource and reach the
broker's state (`state.Broker`) through the aiohttp app, under `state.BROKER`.
"""
