"""nftables commands run in-process through libnftables (what `nft` itself links), so that a
machine's start adds its set elements in tens of microseconds, not a `nft` process's milliseconds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading


class NftError(RuntimeError):
    pass


class Nft:
    """One libnftables context; commands are serialized (a context is not thread-safe)."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("nftables") or "libnftables.so.1"
        lib = ctypes.CDLL(name, use_errno=True)
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        self._lib = lib
        self._ctx = lib.nft_ctx_new(0)
        lib.nft_ctx_buffer_output(self._ctx)
        lib.nft_ctx_buffer_error(self._ctx)
        self._lock = threading.Lock()

    def run(self, commands: str) -> str:
        """Runs `commands` (nft's syntax, one transaction); their output, or raises."""
        with self._lock:
            failed = self._lib.nft_run_cmd_from_buffer(self._ctx, commands.encode())
            out = (self._lib.nft_ctx_get_output_buffer(self._ctx) or b"").decode()
            err = (self._lib.nft_ctx_get_error_buffer(self._ctx) or b"").decode()
        if failed:
            raise NftError(err.strip() or f"nft failed: {commands[:200]}")
        return out


_nft: Nft | None = None
_nft_lock = threading.Lock()


def nft() -> Nft:
    global _nft
    with _nft_lock:
        if _nft is None:
            _nft = Nft()
        return _nft
