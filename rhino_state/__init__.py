"""Rhino state: keyed state in embedded RocksDB, key groups, virtual nodes and routing."""

from rhino_state.backend import RocksDBStateBackend, StateBackendClosedError
from rhino_state.increments import (
    IncrementFormatError,
    IncrementMeta,
    IncrementReader,
    IncrementWriter,
    apply_increment,
    read_increment,
    verify_increment,
    write_increment,
)
from rhino_state.keys import (
    MAX_KEY_GROUPS,
    Key,
    RoutingTable,
    decode_key,
    encode_key,
    key_group,
    stable_hash,
    validate_num_key_groups,
    vnode_key_groups,
    vnode_of,
)
from rhino_state.replica_store import (
    IncrementDigestError,
    IncrementGapError,
    NoCompletedCheckpointError,
    ReplicaStore,
    ReplicaStoreClosedError,
)
from rhino_state.state import MapState, NoCurrentKeyError, StateContext, ValueState

__all__ = [
    "MAX_KEY_GROUPS",
    "IncrementDigestError",
    "IncrementFormatError",
    "IncrementGapError",
    "IncrementMeta",
    "IncrementReader",
    "IncrementWriter",
    "Key",
    "MapState",
    "NoCompletedCheckpointError",
    "NoCurrentKeyError",
    "ReplicaStore",
    "ReplicaStoreClosedError",
    "RocksDBStateBackend",
    "RoutingTable",
    "StateBackendClosedError",
    "StateContext",
    "ValueState",
    "apply_increment",
    "decode_key",
    "encode_key",
    "key_group",
    "read_increment",
    "stable_hash",
    "validate_num_key_groups",
    "vnode_key_groups",
    "verify_increment",
    "vnode_of",
    "write_increment",
]
