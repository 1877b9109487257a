"""A TLS server that picks up a rotated certificate and key without a restart (issue #12).

    python -m examples.tls_reloader --cert /etc/demo/tls.crt --key /etc/demo/tls.key --port 8443
    openssl s_client -connect 127.0.0.1:8443 </dev/null 2>/dev/null | openssl x509 -noout -fingerprint -sha256

The aiohttp server (``asyncio`` under it) is given one SSLContext for its whole life, so
that context only routes: its SNI callback (called by OpenSSL for every ClientHello, with or without SNI)
switches each new connection to the context of the pair being served now. Connections
already established keep the pair they started with.

The reloading is a reloadd consumer object (:class:`CertPair`) passed to
``Reloader(config, consumers=[...])``, with ``state_dir = ""`` so nothing is persisted.
Whenever either file settles, both are read and loaded together; only a pair that
``load_cert_chain`` accepts (it raises when the key is not the certificate's) replaces
the served one. In a half-rotated pair (new certificate, old key, or the reverse) the
half that changed is answered with ``Reject``: reloadd logs it as one WARNING line and
does not retry it, the old pair stays in service, and the change of the other half
completes the rotation.
The pair, not the file, is the unit, so the halves may settle in one batch (written
20 ms apart) or in two (seconds apart) and the end state is the same. Once a pair
loads, a half rejected before is handed over again so no stale rejection stays in
``reloadd status``.

The certificate and key are watched as files: a rotation that renames a new file over
the old one, one that rewrites it in place, and a kubelet Secret volume re-pointing its
``..data`` symlink (both halves at once) are all seen.
"""

from ._consumer import CertPair
from ._pair import Files, Pair, PairError, load_pair, read_files

__all__ = ["CertPair", "Files", "Pair", "PairError", "load_pair", "read_files"]
