"""The broker: the public, Fly-shaped Machines API and market placement. It holds no state of
its own: it reads the catalog, talks to workers over HTTP and answers synchronously."""
