"""What identifies a trained model: a hash of every file of its directory (weights, tokenizer, settings)."""

import hashlib
import os


def model_fingerprint(directory: str, skip=lambda relative_path: False) -> str:
    """A hash of every file under `directory` but those `skip` names, their names and bytes: a retriever's passage
    encoder (an index is never searched with another encoder's vectors, nor with a retriever retrained into the
    same directory) or a reader (a user's label records which reader gave the answer it judged)."""
    h = hashlib.blake2b(digest_size=16)
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            if skip(os.path.relpath(path, directory)):
                continue
            h.update(os.path.relpath(path, directory).encode() + b"\0")
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    h.update(chunk)
    return h.hexdigest()
