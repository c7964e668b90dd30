from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CacheState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_STATE_UNSPECIFIED: _ClassVar[CacheState]
    CACHE_STATE_WRITING: _ClassVar[CacheState]
    CACHE_STATE_READY: _ClassVar[CacheState]

class CacheView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_VIEW_UNSPECIFIED: _ClassVar[CacheView]
    CACHE_VIEW_BASIC: _ClassVar[CacheView]
    CACHE_VIEW_FULL: _ClassVar[CacheView]

class StoreState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STORE_STATE_UNSPECIFIED: _ClassVar[StoreState]
    STORE_STATE_LOCAL: _ClassVar[StoreState]
    STORE_STATE_PUBLISHING: _ClassVar[StoreState]
    STORE_STATE_STORED: _ClassVar[StoreState]
    STORE_STATE_PULLING: _ClassVar[StoreState]
    STORE_STATE_CONFLICT: _ClassVar[StoreState]
    STORE_STATE_REMOTE: _ClassVar[StoreState]

class WriteDecision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WRITE_DECISION_UNSPECIFIED: _ClassVar[WriteDecision]
    WRITE_DECISION_ACCEPTED: _ClassVar[WriteDecision]
    WRITE_DECISION_ALREADY_READY: _ClassVar[WriteDecision]
    WRITE_DECISION_BUSY: _ClassVar[WriteDecision]

class OperationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPERATION_STATE_UNSPECIFIED: _ClassVar[OperationState]
    OPERATION_STATE_RUNNING: _ClassVar[OperationState]
    OPERATION_STATE_SUCCEEDED: _ClassVar[OperationState]
    OPERATION_STATE_FAILED: _ClassVar[OperationState]
    OPERATION_STATE_CANCELLED: _ClassVar[OperationState]
CACHE_STATE_UNSPECIFIED: CacheState
CACHE_STATE_WRITING: CacheState
CACHE_STATE_READY: CacheState
CACHE_VIEW_UNSPECIFIED: CacheView
CACHE_VIEW_BASIC: CacheView
CACHE_VIEW_FULL: CacheView
STORE_STATE_UNSPECIFIED: StoreState
STORE_STATE_LOCAL: StoreState
STORE_STATE_PUBLISHING: StoreState
STORE_STATE_STORED: StoreState
STORE_STATE_PULLING: StoreState
STORE_STATE_CONFLICT: StoreState
STORE_STATE_REMOTE: StoreState
WRITE_DECISION_UNSPECIFIED: WriteDecision
WRITE_DECISION_ACCEPTED: WriteDecision
WRITE_DECISION_ALREADY_READY: WriteDecision
WRITE_DECISION_BUSY: WriteDecision
OPERATION_STATE_UNSPECIFIED: OperationState
OPERATION_STATE_RUNNING: OperationState
OPERATION_STATE_SUCCEEDED: OperationState
OPERATION_STATE_FAILED: OperationState
OPERATION_STATE_CANCELLED: OperationState

class Shard(_message.Message):
    __slots__ = ("index", "first_element", "num_elements", "stored_bytes", "raw_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FIRST_ELEMENT_FIELD_NUMBER: _ClassVar[int]
    NUM_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    first_element: int
    num_elements: int
    stored_bytes: int
    raw_bytes: int
    def __init__(self, index: _Optional[int] = ..., first_element: _Optional[int] = ..., num_elements: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., raw_bytes: _Optional[int] = ...) -> None: ...

class Cache(_message.Message):
    __slots__ = ("name", "state", "fingerprint", "layout_json", "element_spec", "num_elements", "shards", "disk_bytes", "raw_bytes", "stored_bytes", "create_time", "commit_time", "pinned", "ttl_seconds", "last_read_time", "hits", "direct_leases", "direct_reads", "store", "num_shards")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_JSON_FIELD_NUMBER: _ClassVar[int]
    ELEMENT_SPEC_FIELD_NUMBER: _ClassVar[int]
    NUM_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_READ_TIME_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    DIRECT_LEASES_FIELD_NUMBER: _ClassVar[int]
    DIRECT_READS_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: CacheState
    fingerprint: str
    layout_json: str
    element_spec: bytes
    num_elements: int
    shards: _containers.RepeatedCompositeFieldContainer[Shard]
    disk_bytes: int
    raw_bytes: int
    stored_bytes: int
    create_time: float
    commit_time: float
    pinned: bool
    ttl_seconds: float
    last_read_time: float
    hits: int
    direct_leases: int
    direct_reads: int
    store: StoreStatus
    num_shards: int
    def __init__(self, name: _Optional[str] = ..., state: _Optional[_Union[CacheState, str]] = ..., fingerprint: _Optional[str] = ..., layout_json: _Optional[str] = ..., element_spec: _Optional[bytes] = ..., num_elements: _Optional[int] = ..., shards: _Optional[_Iterable[_Union[Shard, _Mapping]]] = ..., disk_bytes: _Optional[int] = ..., raw_bytes: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., create_time: _Optional[float] = ..., commit_time: _Optional[float] = ..., pinned: bool = ..., ttl_seconds: _Optional[float] = ..., last_read_time: _Optional[float] = ..., hits: _Optional[int] = ..., direct_leases: _Optional[int] = ..., direct_reads: _Optional[int] = ..., store: _Optional[_Union[StoreStatus, _Mapping]] = ..., num_shards: _Optional[int] = ...) -> None: ...

class StoreStatus(_message.Message):
    __slots__ = ("state", "done_bytes", "total_bytes", "done_shards", "detail", "requests", "bytes_in", "bytes_out", "resident_shards", "resident_bytes", "streamed_bytes", "resident_reads", "streamed_reads", "window_shards", "window_bytes", "window_reads", "streamed_direct_reads")
    class RequestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STATE_FIELD_NUMBER: _ClassVar[int]
    DONE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DONE_SHARDS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_SHARDS_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    STREAMED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_READS_FIELD_NUMBER: _ClassVar[int]
    STREAMED_READS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SHARDS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_BYTES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_READS_FIELD_NUMBER: _ClassVar[int]
    STREAMED_DIRECT_READS_FIELD_NUMBER: _ClassVar[int]
    state: StoreState
    done_bytes: int
    total_bytes: int
    done_shards: int
    detail: str
    requests: _containers.ScalarMap[str, int]
    bytes_in: int
    bytes_out: int
    resident_shards: int
    resident_bytes: int
    streamed_bytes: int
    resident_reads: int
    streamed_reads: int
    window_shards: int
    window_bytes: int
    window_reads: int
    streamed_direct_reads: int
    def __init__(self, state: _Optional[_Union[StoreState, str]] = ..., done_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., done_shards: _Optional[int] = ..., detail: _Optional[str] = ..., requests: _Optional[_Mapping[str, int]] = ..., bytes_in: _Optional[int] = ..., bytes_out: _Optional[int] = ..., resident_shards: _Optional[int] = ..., resident_bytes: _Optional[int] = ..., streamed_bytes: _Optional[int] = ..., resident_reads: _Optional[int] = ..., streamed_reads: _Optional[int] = ..., window_shards: _Optional[int] = ..., window_bytes: _Optional[int] = ..., window_reads: _Optional[int] = ..., streamed_direct_reads: _Optional[int] = ...) -> None: ...

class ListCachesRequest(_message.Message):
    __slots__ = ("store", "view")
    STORE_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    store: bool
    view: CacheView
    def __init__(self, store: bool = ..., view: _Optional[_Union[CacheView, str]] = ...) -> None: ...

class ListCachesResponse(_message.Message):
    __slots__ = ("caches",)
    CACHES_FIELD_NUMBER: _ClassVar[int]
    caches: _containers.RepeatedCompositeFieldContainer[Cache]
    def __init__(self, caches: _Optional[_Iterable[_Union[Cache, _Mapping]]] = ...) -> None: ...

class GetCacheRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetCacheResponse(_message.Message):
    __slots__ = ("cache",)
    CACHE_FIELD_NUMBER: _ClassVar[int]
    cache: Cache
    def __init__(self, cache: _Optional[_Union[Cache, _Mapping]] = ...) -> None: ...

class DeleteCacheRequest(_message.Message):
    __slots__ = ("name", "store")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    name: str
    store: bool
    def __init__(self, name: _Optional[str] = ..., store: bool = ...) -> None: ...

class DeleteCacheResponse(_message.Message):
    __slots__ = ("local", "stored")
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    local: bool
    stored: bool
    def __init__(self, local: bool = ..., stored: bool = ...) -> None: ...

class WriteBegin(_message.Message):
    __slots__ = ("name", "fingerprint", "layout_json", "element_spec", "shard_bytes", "local")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_JSON_FIELD_NUMBER: _ClassVar[int]
    ELEMENT_SPEC_FIELD_NUMBER: _ClassVar[int]
    SHARD_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    fingerprint: str
    layout_json: str
    element_spec: bytes
    shard_bytes: int
    local: bool
    def __init__(self, name: _Optional[str] = ..., fingerprint: _Optional[str] = ..., layout_json: _Optional[str] = ..., element_spec: _Optional[bytes] = ..., shard_bytes: _Optional[int] = ..., local: bool = ...) -> None: ...

class WriteChunk(_message.Message):
    __slots__ = ("lengths", "data", "raw_bytes")
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_FIELD_NUMBER: _ClassVar[int]
    lengths: bytes
    data: bytes
    raw_bytes: int
    def __init__(self, lengths: _Optional[bytes] = ..., data: _Optional[bytes] = ..., raw_bytes: _Optional[int] = ...) -> None: ...

class WriteFinish(_message.Message):
    __slots__ = ("num_elements", "staged_shards", "failed")
    NUM_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    STAGED_SHARDS_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    num_elements: int
    staged_shards: _containers.RepeatedCompositeFieldContainer[StagedShard]
    failed: str
    def __init__(self, num_elements: _Optional[int] = ..., staged_shards: _Optional[_Iterable[_Union[StagedShard, _Mapping]]] = ..., failed: _Optional[str] = ...) -> None: ...

class WriteCacheRequest(_message.Message):
    __slots__ = ("begin", "chunk", "finish")
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    begin: WriteBegin
    chunk: WriteChunk
    finish: WriteFinish
    def __init__(self, begin: _Optional[_Union[WriteBegin, _Mapping]] = ..., chunk: _Optional[_Union[WriteChunk, _Mapping]] = ..., finish: _Optional[_Union[WriteFinish, _Mapping]] = ...) -> None: ...

class WriteBegun(_message.Message):
    __slots__ = ("decision", "cache", "local_dir", "data_dir", "instance_token", "shard_bytes")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_DIR_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SHARD_BYTES_FIELD_NUMBER: _ClassVar[int]
    decision: WriteDecision
    cache: Cache
    local_dir: str
    data_dir: str
    instance_token: str
    shard_bytes: int
    def __init__(self, decision: _Optional[_Union[WriteDecision, str]] = ..., cache: _Optional[_Union[Cache, _Mapping]] = ..., local_dir: _Optional[str] = ..., data_dir: _Optional[str] = ..., instance_token: _Optional[str] = ..., shard_bytes: _Optional[int] = ...) -> None: ...

class WriteCacheResponse(_message.Message):
    __slots__ = ("begun", "committed")
    BEGUN_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    begun: WriteBegun
    committed: Cache
    def __init__(self, begun: _Optional[_Union[WriteBegun, _Mapping]] = ..., committed: _Optional[_Union[Cache, _Mapping]] = ...) -> None: ...

class ReadShardRequest(_message.Message):
    __slots__ = ("name", "shard", "start", "chunk_bytes", "fingerprint", "count", "epoch_start")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_START_FIELD_NUMBER: _ClassVar[int]
    name: str
    shard: int
    start: int
    chunk_bytes: int
    fingerprint: str
    count: int
    epoch_start: bool
    def __init__(self, name: _Optional[str] = ..., shard: _Optional[int] = ..., start: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., fingerprint: _Optional[str] = ..., count: _Optional[int] = ..., epoch_start: bool = ...) -> None: ...

class ReadShardResponse(_message.Message):
    __slots__ = ("start", "lengths", "data")
    START_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    start: int
    lengths: bytes
    data: bytes
    def __init__(self, start: _Optional[int] = ..., lengths: _Optional[bytes] = ..., data: _Optional[bytes] = ...) -> None: ...

class SetCacheRetentionRequest(_message.Message):
    __slots__ = ("name", "pinned", "ttl_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    pinned: bool
    ttl_seconds: float
    def __init__(self, name: _Optional[str] = ..., pinned: bool = ..., ttl_seconds: _Optional[float] = ...) -> None: ...

class SetCacheRetentionResponse(_message.Message):
    __slots__ = ("cache",)
    CACHE_FIELD_NUMBER: _ClassVar[int]
    cache: Cache
    def __init__(self, cache: _Optional[_Union[Cache, _Mapping]] = ...) -> None: ...

class StartMaterializeRequest(_message.Message):
    __slots__ = ("name", "entry_point", "graph_def", "element_spec", "num_shards", "workers", "overwrite", "resume", "fingerprint", "block_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENTRY_POINT_FIELD_NUMBER: _ClassVar[int]
    GRAPH_DEF_FIELD_NUMBER: _ClassVar[int]
    ELEMENT_SPEC_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    entry_point: str
    graph_def: bytes
    element_spec: bytes
    num_shards: int
    workers: int
    overwrite: bool
    resume: bool
    fingerprint: str
    block_bytes: int
    def __init__(self, name: _Optional[str] = ..., entry_point: _Optional[str] = ..., graph_def: _Optional[bytes] = ..., element_spec: _Optional[bytes] = ..., num_shards: _Optional[int] = ..., workers: _Optional[int] = ..., overwrite: bool = ..., resume: bool = ..., fingerprint: _Optional[str] = ..., block_bytes: _Optional[int] = ...) -> None: ...

class OperationError(_message.Message):
    __slots__ = ("code", "reason", "message", "shard")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    message: str
    shard: int
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., shard: _Optional[int] = ...) -> None: ...

class Operation(_message.Message):
    __slots__ = ("name", "done", "state", "cache", "shards_total", "shards_done", "shards_resumed", "elements", "raw_bytes", "stored_bytes", "bytes_per_second", "elements_per_second", "eta_seconds", "start_time", "end_time", "workers", "shard_errors", "error")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SHARDS_DONE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_RESUMED_FIELD_NUMBER: _ClassVar[int]
    ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    ELEMENTS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    ETA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    SHARD_ERRORS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    done: bool
    state: OperationState
    cache: str
    shards_total: int
    shards_done: int
    shards_resumed: int
    elements: int
    raw_bytes: int
    stored_bytes: int
    bytes_per_second: float
    elements_per_second: float
    eta_seconds: float
    start_time: float
    end_time: float
    workers: int
    shard_errors: _containers.RepeatedCompositeFieldContainer[OperationError]
    error: OperationError
    def __init__(self, name: _Optional[str] = ..., done: bool = ..., state: _Optional[_Union[OperationState, str]] = ..., cache: _Optional[str] = ..., shards_total: _Optional[int] = ..., shards_done: _Optional[int] = ..., shards_resumed: _Optional[int] = ..., elements: _Optional[int] = ..., raw_bytes: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., bytes_per_second: _Optional[float] = ..., elements_per_second: _Optional[float] = ..., eta_seconds: _Optional[float] = ..., start_time: _Optional[float] = ..., end_time: _Optional[float] = ..., workers: _Optional[int] = ..., shard_errors: _Optional[_Iterable[_Union[OperationError, _Mapping]]] = ..., error: _Optional[_Union[OperationError, _Mapping]] = ...) -> None: ...

class GetOperationRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class WatchOperationRequest(_message.Message):
    __slots__ = ("name", "interval")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    interval: float
    def __init__(self, name: _Optional[str] = ..., interval: _Optional[float] = ...) -> None: ...

class CancelOperationRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class StartMaterializeResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...

class GetOperationResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...

class WatchOperationResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...

class CancelOperationResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...

class ReadElementsRequest(_message.Message):
    __slots__ = ("name", "fingerprint", "indices", "chunk_bytes", "epoch_start")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_START_FIELD_NUMBER: _ClassVar[int]
    name: str
    fingerprint: str
    indices: bytes
    chunk_bytes: int
    epoch_start: bool
    def __init__(self, name: _Optional[str] = ..., fingerprint: _Optional[str] = ..., indices: _Optional[bytes] = ..., chunk_bytes: _Optional[int] = ..., epoch_start: bool = ...) -> None: ...

class ReadElementsResponse(_message.Message):
    __slots__ = ("position", "lengths", "data")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    position: int
    lengths: bytes
    data: bytes
    def __init__(self, position: _Optional[int] = ..., lengths: _Optional[bytes] = ..., data: _Optional[bytes] = ...) -> None: ...

class AcquireReadLeaseRequest(_message.Message):
    __slots__ = ("name", "fingerprint", "epoch_start", "shards", "data_plane", "pass_shards")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_START_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    PASS_SHARDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    fingerprint: str
    epoch_start: bool
    shards: _containers.RepeatedScalarFieldContainer[int]
    data_plane: bool
    pass_shards: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., fingerprint: _Optional[str] = ..., epoch_start: bool = ..., shards: _Optional[_Iterable[int]] = ..., data_plane: bool = ..., pass_shards: _Optional[_Iterable[int]] = ...) -> None: ...

class AcquireReadLeaseResponse(_message.Message):
    __slots__ = ("lease_id", "ttl_seconds", "cache", "data_dir", "shard_dirs", "instance_token", "instance_token_path", "ticket", "data_port", "streamed_shards")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_FIELD_NUMBER: _ClassVar[int]
    SHARD_DIRS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TOKEN_PATH_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    STREAMED_SHARDS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    ttl_seconds: float
    cache: Cache
    data_dir: str
    shard_dirs: _containers.RepeatedScalarFieldContainer[str]
    instance_token: str
    instance_token_path: str
    ticket: bytes
    data_port: int
    streamed_shards: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, lease_id: _Optional[str] = ..., ttl_seconds: _Optional[float] = ..., cache: _Optional[_Union[Cache, _Mapping]] = ..., data_dir: _Optional[str] = ..., shard_dirs: _Optional[_Iterable[str]] = ..., instance_token: _Optional[str] = ..., instance_token_path: _Optional[str] = ..., ticket: _Optional[bytes] = ..., data_port: _Optional[int] = ..., streamed_shards: _Optional[_Iterable[int]] = ...) -> None: ...

class RenewReadLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class RenewReadLeaseResponse(_message.Message):
    __slots__ = ("ttl_seconds",)
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ttl_seconds: float
    def __init__(self, ttl_seconds: _Optional[float] = ...) -> None: ...

class ReleaseReadLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ReleaseReadLeaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HoldStreamedShardRequest(_message.Message):
    __slots__ = ("lease_id", "shard")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    shard: int
    def __init__(self, lease_id: _Optional[str] = ..., shard: _Optional[int] = ...) -> None: ...

class HoldStreamedShardResponse(_message.Message):
    __slots__ = ("shard_dir", "resident")
    SHARD_DIR_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_FIELD_NUMBER: _ClassVar[int]
    shard_dir: str
    resident: bool
    def __init__(self, shard_dir: _Optional[str] = ..., resident: bool = ...) -> None: ...

class ReleaseStreamedShardRequest(_message.Message):
    __slots__ = ("lease_id", "shard", "read_to_end")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    READ_TO_END_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    shard: int
    read_to_end: bool
    def __init__(self, lease_id: _Optional[str] = ..., shard: _Optional[int] = ..., read_to_end: bool = ...) -> None: ...

class ReleaseStreamedShardResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StagedShard(_message.Message):
    __slots__ = ("index", "num_elements", "num_records", "stored_bytes", "raw_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    NUM_RECORDS_FIELD_NUMBER: _ClassVar[int]
    STORED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RAW_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    num_elements: int
    num_records: int
    stored_bytes: int
    raw_bytes: int
    def __init__(self, index: _Optional[int] = ..., num_elements: _Optional[int] = ..., num_records: _Optional[int] = ..., stored_bytes: _Optional[int] = ..., raw_bytes: _Optional[int] = ...) -> None: ...

class ReaderFigures(_message.Message):
    __slots__ = ("training_job", "rank", "cache", "path", "elements", "bytes", "chunks", "chunk_seconds", "stall_seconds")
    TRAINING_JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    training_job: str
    rank: int
    cache: str
    path: str
    elements: int
    bytes: int
    chunks: int
    chunk_seconds: float
    stall_seconds: float
    def __init__(self, training_job: _Optional[str] = ..., rank: _Optional[int] = ..., cache: _Optional[str] = ..., path: _Optional[str] = ..., elements: _Optional[int] = ..., bytes: _Optional[int] = ..., chunks: _Optional[int] = ..., chunk_seconds: _Optional[float] = ..., stall_seconds: _Optional[float] = ...) -> None: ...

class ReportReadsRequest(_message.Message):
    __slots__ = ("reporter", "readers")
    REPORTER_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    reporter: str
    readers: _containers.RepeatedCompositeFieldContainer[ReaderFigures]
    def __init__(self, reporter: _Optional[str] = ..., readers: _Optional[_Iterable[_Union[ReaderFigures, _Mapping]]] = ...) -> None: ...

class ReportReadsResponse(_message.Message):
    __slots__ = ("expiry_seconds",)
    EXPIRY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    expiry_seconds: float
    def __init__(self, expiry_seconds: _Optional[float] = ...) -> None: ...
