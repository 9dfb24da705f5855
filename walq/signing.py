"""walq's signing key: the secret remote claims' tokens are signed with
(``sqlq.common.tokens``), one small file beside the log, made once.

The first call makes it at random and writes it as every walq file that must never be
torn is written: to a temporary name (created 0600, never through a link), synced,
renamed into place and the directory synced. So a crash leaves no key (the next call
makes one; a token signed with a key that never became durable was never handed out,
since ``signing_key`` returns only after the rename is durable) or the whole key. A
temporary file left by such a crash is removed. Later opens read the file. Its bytes
are never logged: an error names the file, never what it holds.
"""

from __future__ import annotations

import os

from sqlq.common.errors import StoreError
from sqlq.common.tokens import KEY_BYTES
from sqlq.walq.files import FileOps, write_new

KEY_NAME = "signing.key"


def load_or_make(fs: FileOps, path: str) -> bytes:
    """The key at ``path``; if there is none, a new random one, durable on return. Runs on the
    engine's I/O thread, so two first calls never race (the second reads the first's)."""
    tmp = path + ".tmp"
    if fs.exists(tmp):  # a crash between its creation and the rename: never the key
        fs.remove(tmp)
    if fs.exists(path):
        key = fs.read(path)
        if len(key) != KEY_BYTES:
            raise StoreError(f"{path}: holds {len(key)} bytes, not a {KEY_BYTES}-byte key")
        return key
    key = os.urandom(KEY_BYTES)
    write_new(fs, tmp, key)
    fs.replace(tmp, path)
    fs.fsync_dir(os.path.dirname(path) or ".")
    return key
