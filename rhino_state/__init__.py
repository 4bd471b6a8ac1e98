"""Rhino state: keyed state in embedded RocksDB, key groups, virtual nodes and routing."""

from rhino_state.backend import RocksDBStateBackend, StateBackendClosedError
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
from rhino_state.state import MapState, NoCurrentKeyError, StateContext, ValueState

__all__ = [
    "MAX_KEY_GROUPS",
    "Key",
    "MapState",
    "NoCurrentKeyError",
    "RocksDBStateBackend",
    "RoutingTable",
    "StateBackendClosedError",
    "StateContext",
    "ValueState",
    "decode_key",
    "encode_key",
    "key_group",
    "stable_hash",
    "validate_num_key_groups",
    "vnode_key_groups",
    "vnode_of",
]
