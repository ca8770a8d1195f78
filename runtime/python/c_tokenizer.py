"""The C tokenizer of libedgellm (runtime/tokenizer/tokenizer.h) through ctypes: what edgellm-run does on the device, usable
from Python for tests and for checking a package's tokenizer.bin against tokenizer.json."""
from __future__ import annotations

import ctypes as C
from pathlib import Path

from ...errors import InputError, PackageError
from .lib import last_error, lib


class CTokenizer:
    def __init__(self, path: str | Path):
        self._lib = lib()
        self._h = self._lib.el_tok_load(str(path).encode())
        if not self._h:
            raise PackageError(last_error())

    def close(self) -> None:
        if getattr(self, "_h", None):
            self._lib.el_tok_free(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def __enter__(self) -> CTokenizer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def bos(self) -> int:
        return self._lib.el_tok_bos(self._h)

    @property
    def n_vocab(self) -> int:
        return self._lib.el_tok_n_vocab(self._h)

    def is_special(self, token_id: int) -> bool:
        return bool(self._lib.el_tok_is_special(self._h, token_id))

    def encode(self, text: str | bytes, add_bos: int = -1) -> list[int]:
        """add_bos < 0: like HF encode(add_special_tokens=True); 0: no special ids; > 0: BOS first."""
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        cap = len(data) + 8
        while True:
            out = (C.c_int32 * cap)()
            n = self._lib.el_tok_encode(self._h, data, len(data), add_bos, out, cap)
            if n < 0:
                raise InputError(last_error())
            if n <= cap:
                return list(out[:n])
            cap = n

    def decode_piece(self, token_id: int) -> bytes:
        n = self._lib.el_tok_decode(self._h, token_id, None, 0)
        if n < 0:
            raise InputError(last_error())
        buf = C.create_string_buffer(n + 1)
        self._lib.el_tok_decode(self._h, token_id, buf, n + 1)
        return buf.raw[:n]

    def decode(self, ids: list[int], skip_special: bool = False) -> bytes:
        """The concatenated pieces (bytes: a cut may fall inside a UTF-8 character)."""
        buf, out = C.create_string_buffer(256), []
        for i in ids:
            if skip_special and self.is_special(i):
                continue
            n = self._lib.el_tok_decode(self._h, i, buf, len(buf))
            if n < 0:
                raise InputError(last_error())
            out.append(buf.raw[:n] if n < len(buf) else self.decode_piece(i))
        return b"".join(out)
