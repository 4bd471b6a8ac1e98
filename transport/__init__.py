"""The transport layer shared by every package: gRPC servers and peers with signed calls and
optional TLS (:mod:`transport.rpc`, :mod:`transport.security`), the data plane's signed frames
over sockets (:mod:`transport.frames`), the control plane's safe encoding
(:mod:`transport.wire`); the Kafka client helpers (:mod:`transport.kafka_io`).  It imports
nothing from the project."""
