"""The transport layer shared by every package: gRPC servers and peers with signed calls and
optional TLS (:mod:`transport.rpc`, :mod:`transport.security`), and the control plane's safe
encoding (:mod:`transport.wire`).  It imports nothing from the project."""
