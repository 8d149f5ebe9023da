"""How a replica keeps up with the owners over the bus: their live batches (`batches`) and
heartbeats (`heartbeats`), pulls of what it missed (`pull`), their certificates
(`certificates`), a snapshot from another replica at start (`bootstrap`) and its own served to
others (`snapshot`), and the audit of what the bus vouches for (`audit`)."""
