"""What a cache looks like in the object store: its keys and its manifest.

Below the store's ``s3://BUCKET/PREFIX``::

    <name>/manifest.json                    the cache's commit point, created last
                                            with If-None-Match: * (one per name)
    <name>/objects/<upload>/shard-00000.mdb a shard's data.mdb; <upload> is random per
                                            publish (or per Indexed Job attempt)
    <name>/job-<fingerprint>/shard-00000.json
                                            an Indexed Job's shard marker, created with
                                            If-None-Match: * once its object is stored

The manifest is the local manifest.json's record (docs/format.md) plus, per
shard, the object holding it with its size and SHA-256. Objects are written
before the manifest names them and are never rewritten: two publishers of one
name each upload under their own ``<upload>``, and the one whose manifest create
loses deletes its objects. A cache is in the store exactly when its manifest is.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import asdict, dataclass, replace

from cacheserver.catalog.manifest import CacheRecord, ShardInfo
from cacheserver.tier.bucket import StoredObject

FORMAT = 1
_HEX = re.compile(r"[0-9a-f]{64}")


def manifest_key(name: str) -> str:
    return f"{name}/manifest.json"


def new_upload() -> str:
    return uuid.uuid4().hex


def object_key(name: str, upload: str, shard: int) -> str:
    return f"{name}/objects/{upload}/shard-{shard:05d}.mdb"


def marker_key(name: str, fingerprint: str, shard: int) -> str:
    return f"{name}/job-{_safe(fingerprint)}/shard-{shard:05d}.json"


def _safe(fingerprint: str) -> str:
    """The fingerprint as one key component (it is hex already; anything else is hashed)."""
    if re.fullmatch(r"[0-9A-Za-z_.-]{1,128}", fingerprint):
        return fingerprint
    return hashlib.sha256(fingerprint.encode()).hexdigest()


@dataclass
class StoredCache:
    """A cache as the store holds it: its READY record and one object per shard."""

    record: CacheRecord
    objects: list[StoredObject]

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects)

    def to_doc(self) -> dict:
        return {
            "format": FORMAT,
            "cache": json.loads(self.record.to_json()),
            "objects": [asdict(o) for o in self.objects],
        }

    @classmethod
    def from_doc(cls, name: str, doc: object) -> StoredCache:
        """Parse and check a stored manifest; ValueError saying what is wrong."""
        try:
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError(
                    "not a manifest of format 1: upgrade shardcache or rebuild the cache"
                )
            record = CacheRecord.from_json(json.dumps(doc["cache"]))
            objects = [
                StoredObject(str(o["key"]), int(o["size"]), str(o["sha256"]))
                for o in doc["objects"]
            ]
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{type(exc).__name__}: {exc}") from None
        if record.name != name or record.state != "READY":
            raise ValueError(f"it describes {record.state} cache {record.name!r}")
        if len(objects) != len(record.shards):
            raise ValueError(f"{len(record.shards)} shards but {len(objects)} objects")
        for o in objects:
            if (
                not o.key.startswith(f"{name}/objects/")
                or ".." in o.key
                or not _HEX.fullmatch(o.sha256)
                or o.size < 0
            ):
                raise ValueError(f"object {o.key[:200]!r} is not one of the cache's objects")
        return cls(record, objects)


@dataclass
class ShardMarker:
    """An Indexed Job's committed shard: its counts, its object and the layout it wrote."""

    shard: ShardInfo
    object: StoredObject
    layout_json: str
    element_spec: bytes

    def to_doc(self) -> dict:
        return {
            "shard": asdict(self.shard),
            "object": asdict(self.object),
            "layout_json": self.layout_json,
            "element_spec": self.element_spec.hex(),
        }

    @classmethod
    def from_doc(cls, doc: dict) -> ShardMarker:
        try:
            return cls(
                ShardInfo(**doc["shard"]),
                StoredObject(**doc["object"]),
                str(doc["layout_json"]),
                bytes.fromhex(doc["element_spec"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"unreadable shard marker: {type(exc).__name__}: {exc}") from None


def assemble(
    name: str, fingerprint: str, markers: list[ShardMarker], create_time: float, commit_time: float
) -> StoredCache:
    """The manifest of an Indexed Job's cache from its shards' markers, in shard order."""
    if not markers:
        raise ValueError("no shards")
    first, shards = 0, []
    for i, m in enumerate(markers):
        if m.shard.index != i:
            raise ValueError(f"shard {i} missing (marker says {m.shard.index})")
        shards.append(replace(m.shard, first_element=first))
        first += m.shard.num_elements
    nonempty = [m for m in markers if m.shard.num_elements] or markers
    layouts = {m.layout_json for m in nonempty}
    if len(layouts) != 1:
        raise ValueError(f"shards disagree on the element layout: {sorted(layouts)[:2]}")
    record = CacheRecord(
        name,
        fingerprint,
        nonempty[0].layout_json,
        nonempty[0].element_spec,
        "READY",
        create_time,
        commit_time,
        shards,
        sum(m.object.size for m in markers),
    ).check()
    return StoredCache(record, [m.object for m in markers])
