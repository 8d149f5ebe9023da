"""The private network's host side (docs/network.md): nftables isolation, the `.internal` DNS,
the WireGuard mesh. Used by the worker and the proxy; imports nothing of theirs."""


def hostport(address: str, port: int | None) -> str:
    """`address:port` as a URL or a scrape target writes it: an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
