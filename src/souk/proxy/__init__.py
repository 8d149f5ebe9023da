"""The HTTP edge: routes requests to an app's machines, starts stopped ones on demand, stops idle
ones. See docs/proxy.md."""
