"""OCI images for the worker: pull from a registry, cache by digest, unpack root filesystems."""
