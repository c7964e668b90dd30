"""The object store's requests, classified as its price list counts them and put to caches."""

from __future__ import annotations

import pytest

from cacheserver.tier.requests import MAX_CACHES, StoreRequests, op_kind


@pytest.mark.parametrize(
    ("operation", "kind"),
    [
        ("GetObject", "GET"),
        ("ListObjectsV2", "LIST"),
        ("HeadBucket", "HEAD"),
        ("HeadObject", "HEAD"),
        ("DeleteObjects", "DELETE"),
        ("AbortMultipartUpload", "DELETE"),
        ("PutObject", "PUT"),
        ("UploadPart", "PUT"),
        ("CreateMultipartUpload", "PUT"),
        ("CompleteMultipartUpload", "PUT"),
    ],
)
def test_s3_operations_are_counted_by_the_kind_the_store_bills(operation, kind) -> None:
    assert op_kind(operation) == kind


def test_a_key_belongs_to_the_cache_named_by_its_first_component_below_the_prefix() -> None:
    counted = StoreRequests("tier")
    assert counted.cache_of("tier/imgs/objects/u/shard-00000.mdb") == "imgs"
    assert counted.cache_of("tier/imgs/") == "imgs"
    assert counted.cache_of("tier/") == ""  # a listing of every cache is no cache's
    assert counted.cache_of("other/imgs/manifest.json") == ""
    assert StoreRequests("").cache_of("imgs/manifest.json") == "imgs"


class _Request:
    def __init__(self, body: bytes, context: dict) -> None:
        self.headers: dict = {}
        self.data, self.context = body, context


def test_per_cache_tallies_stay_bounded_and_keep_the_most_recent() -> None:
    counted = StoreRequests("")
    for i in range(MAX_CACHES + 10):
        context: dict = {}
        counted._before_build(params={"Key": f"c{i}/manifest.json"}, context=context)
        counted._created(_Request(b"x" * 3, context), "PutObject")
        counted._received({"headers": {"content-length": "5"}}, context)
    assert counted.of("c0").requests == {}  # dropped, oldest first
    last = counted.of(f"c{MAX_CACHES + 9}")
    assert (last.requests, last.bytes_out, last.bytes_in) == ({"PUT": 1}, 3, 5)
    assert len(counted._caches) == MAX_CACHES
