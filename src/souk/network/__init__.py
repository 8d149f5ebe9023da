"""The private network's host side (docs/network.md): nftables isolation, the `.internal` DNS,
the WireGuard mesh. Used by the worker and the proxy; imports nothing of theirs."""
