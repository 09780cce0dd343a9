"""Whether a file changed, for what re-reads files in a running process: the policy file (server/reloader.py,
server/live_policy.py) and the serving certificate and key (tls/serving.py).

Kubernetes updates a mounted ConfigMap or Secret by writing a new timestamped directory and swapping the
`..data` symlink, so the path stays while the file it resolves to changes; a renewal in place keeps the
inode and changes size, mtime or ctime. The signature covers both.
"""

from __future__ import annotations

import os

# (device, inode, size, mtime, ctime) in nanoseconds.
Signature = tuple[int, int, int, int, int]


def file_signature(path: str) -> Signature | None:
    """The signature of the file `path` resolves to (symlinks followed); None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
