"""deploy/grafana: every dashboard query parses and selects what a real daemon exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import data_port
import grpc
import pytest
from daemon import free_port
from deploy_tree import DASHBOARD
from exposition import exposition, scrape
from prometheus_client.parser import text_string_to_metric_families
from sharded import write_sharded
from stores import source, store_daemon, wait_for

#: a cache larger than the fixture daemon's room
LARGER = "larger"
#: labels Prometheus adds to every series it scrapes
TARGET_LABELS = frozenset({"instance", "job"})
#: PromQL words that are neither metrics nor functions
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset"})
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_MATCH_OPS = frozenset({"=", "!=", "=~", "!~"})
_CLOSING = {"(": ")", "{": "}", "[": "]"}
_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<variable>\$\{\w+(?::\w+)?\}|\$\w+)
  | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?)
  | (?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=,])
  | (?P<open>[({[])
  | (?P<close>[)}\]])
""",
    re.VERBOSE,
)


@dataclass
class Selector:
    """One instant or range vector selector of a PromQL expression."""

    metric: str
    matchers: dict[str, tuple[str, str]]  # label: (operator, value)


def _tokens(expr: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None:
            raise ValueError(f"cannot read {expr[pos:]!r} in {expr!r}")
        if match.lastgroup != "space":
            tokens.append((str(match.lastgroup), match.group()))
        pos = match.end()
    return tokens


def parse_promql(expr: str) -> tuple[list[Selector], set[str]]:
    """The selectors of expr and the labels its by/without/on/ignoring clauses name.

    Enough of PromQL for a dashboard's queries: brackets must balance, every
    selector names its metric, and a matcher is LABEL OP "STRING"; Grafana's
    $variables stand where PromQL takes a duration or a string."""
    tokens = _tokens(expr)
    selectors: list[Selector] = []
    grouping: set[str] = set()
    opened: list[str] = []
    i = 0
    try:
        while i < len(tokens):
            kind, text = tokens[i]
            following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
            if kind == "open":
                if text == "{":
                    raise ValueError(f"a selector without a metric name in {expr!r}")
                opened.append(text)
            elif kind == "close":
                if not opened or _CLOSING[opened.pop()] != text:
                    raise ValueError(f"unbalanced {text!r} in {expr!r}")
            elif kind == "name" and text in _GROUPING and following == "(":
                i += 2
                while tokens[i][1] != ")":
                    label, sep = tokens[i], tokens[i + 1][1]
                    if label[0] != "name" or sep not in (",", ")"):
                        raise ValueError(f"bad label list at {label[1]!r} in {expr!r}")
                    grouping.add(label[1])
                    i += 2 if sep == "," else 1
            elif (
                kind == "name"
                and text not in _KEYWORDS | _GROUPING
                and following not in ("(", "by", "without")
            ):  # not sum(...), sum by (...)
                matchers: dict[str, tuple[str, str]] = {}
                if following == "{":
                    i += 2
                    while tokens[i][1] != "}":
                        (lkind, label), (_, op), (vkind, value) = tokens[i : i + 3]
                        if lkind != "name" or op not in _MATCH_OPS or vkind != "string":
                            raise ValueError(f"bad matcher {label}{op}{value} in {expr!r}")
                        matchers[label] = (op, value[1:-1])
                        i += 3
                        if tokens[i][1] == ",":
                            i += 1
                selectors.append(Selector(text, matchers))
            i += 1
    except IndexError as exc:
        raise ValueError(f"{expr!r} ends in the middle of a selector") from exc
    if opened:
        raise ValueError(f"{opened[-1]!r} never closed in {expr!r}")
    return selectors, grouping


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows (collapsed rows hold theirs) included."""
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(where, PromQL, the panel's or variable's JSON) of every query the dashboard runs."""
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"], panel
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            # Grafana's label_values(METRIC, LABEL) is the series METRIC{LABEL!=""}
            metric, label = re.fullmatch(
                r"label_values\((\w+),\s*(\w+)\)", variable["definition"]
            ).groups()
            yield f"variable {variable['name']!r}", f'{metric}{{{label}!=""}}', variable


def dashboard_problems(dashboard: dict[str, Any], exported: dict[str, set[str]]) -> list[str]:
    """What in the dashboard's queries the daemon does not export (exported: sample name
    to its label names), or does not parse, or ignores the $instance variable."""
    problems = []
    for where, expr, _ in _queries(dashboard):
        try:
            selectors, grouping = parse_promql(expr)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if not selectors:
            problems.append(f"{where}: selects no metric")
        labels = set(TARGET_LABELS)
        for s in selectors:
            if not s.metric.startswith("shardcache_") or s.metric not in exported:
                problems.append(f"{where}: {s.metric} is not a metric the daemon exports")
                continue
            labels |= exported[s.metric]
            unknown = set(s.matchers) - exported[s.metric] - TARGET_LABELS
            if unknown:
                problems.append(f"{where}: {s.metric} has no label {sorted(unknown)}")
            if where.startswith("panel") and s.matchers.get("instance") != ("=~", "$instance"):
                problems.append(f"{where}: {s.metric} ignores $instance")
        for label in sorted(grouping - labels):
            problems.append(f"{where}: no series of it has the label {label!r}")
    return problems


def _exported(url: str) -> dict[str, set[str]]:
    """The exposition's sample names (histograms' _bucket/_count/_sum, counters' _total)
    and the label names each carries."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition(url)):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


@pytest.fixture(scope="module")
def exported(moto_server: Any) -> Iterator[dict[str, set[str]]]:
    """What a real daemon exports once it has written, read (over gRPC and over the data
    plane) and refused something (a call, a data connection), and read a cache larger than
    its room from its object store (partially resident: the residency series)."""
    tf = pytest.importorskip("tensorflow")
    from client import CacheClient, CacheNotFoundError

    store = moto_server.start().store()
    publisher = store_daemon(store)
    try:
        with CacheClient(publisher.unix_target) as cc:  # 16 shards of ~150 KB
            write_sharded(
                cc, source(512), LARGER, 16 << 10, chunk_bytes=64 << 10, batch_elements=16
            )
            total = wait_for(cc, LARGER, "STORED").store_total_bytes
    finally:
        publisher.close()
    url = f"http://127.0.0.1:{free_port()}/metrics"
    d = store_daemon(store, "--metrics-listen", url.split("/")[2], "--max-bytes", str(total // 2))
    try:
        with CacheClient(d.unix_target) as cc:
            ds = cc.cache(tf.data.Dataset.range(100), name="dashboard", direct=False)
            for _ in range(2):  # the write epoch, then a read epoch
                assert [int(x) for x in ds] == list(range(100))
            with pytest.raises(CacheNotFoundError):
                cc.info("absent")  # an RPC error: shardcache_rpc_errors_total gets a series
        with CacheClient(d.tcp_target) as cc:  # a remote reader: over the data plane
            assert [int(x) for x in cc.dataset("dashboard", direct=False)] == list(range(100))
        with grpc.insecure_channel(d.tcp_target) as ch:  # a stranger on the data port
            granted = data_port.lease(ch, "dashboard")
            with data_port.connect(granted.data_port) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
                assert data_port.error(sock)[0] == "INVALID_ARGUMENT"
            data_port.release(ch, granted)
        # this daemon's metrics, after that: the socket's read epoch went over gRPC, the
        # TCP reader's over the data plane
        samples = scrape(url)
        assert samples[("shardcache_read_elements_total", ())] == 200
        for plane in ("grpc", "data"):
            assert samples[("shardcache_read_bytes_total", (("plane", plane),))] > 0, plane
        with CacheClient(d.unix_target) as cc:  # half of it resident, the rest streamed
            assert len(list(cc.dataset(LARGER, shuffle="shards", seed=7))) == 512
            assert 0 < cc.info(LARGER).resident_shards < 16
        yield _exported(url)
    finally:
        d.close()


def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def test_every_dashboard_query_parses_and_selects_metrics_and_labels_the_daemon_exports(
    exported: dict[str, set[str]],
) -> None:
    dashboard = _dashboard()
    assert dashboard_problems(dashboard, exported) == []
    selected = {s.metric for _, expr, _ in _queries(dashboard) for s in parse_promql(expr)[0]}
    # the panels the dashboard promises, each on the series it needs
    for metric in (
        "shardcache_read_bytes_total",
        "shardcache_read_elements_total",
        "shardcache_cache_hits_total",
        "shardcache_cache_misses_total",
        "shardcache_rpc_duration_seconds_bucket",
        "shardcache_rpc_errors_total",
        "shardcache_disk_bytes",
        "shardcache_capacity_bytes",
        "shardcache_store_published_bytes_total",
        "shardcache_store_pulled_bytes_total",
        "shardcache_store_errors_total",
        "shardcache_store_unpublished_caches",
        "shardcache_data_connections",
        "shardcache_data_refused_total",
        "shardcache_data_fallbacks_total",
        "shardcache_reader_bytes_total",
        "shardcache_reader_elements_total",
        "shardcache_reader_stall_seconds_total",
        "shardcache_store_requests_total",
        "shardcache_store_bytes_total",
        "shardcache_cache_resident_bytes",
        "shardcache_cache_resident_shards",
        "shardcache_cache_streamed_bytes_total",
        "shardcache_cache_shard_reads_total",
        "shardcache_cache_hit_ratio",
    ):
        assert metric in selected, metric


def _groupings() -> dict[str, set[frozenset[str]]]:
    """Per metric the dashboard queries, the label sets its queries aggregate by."""
    grouped: dict[str, set[frozenset[str]]] = {}
    for _, expr, _ in _queries(_dashboard()):
        selectors, grouping = parse_promql(expr)
        for s in selectors:
            grouped.setdefault(s.metric, set()).add(frozenset(grouping))
    return grouped


def test_the_dashboard_shows_throughput_per_training_job_and_stall_per_rank(
    exported: dict[str, set[str]],
) -> None:
    grouped = _groupings()
    # the fixture's readers reported themselves: the series exist, with these labels
    assert {"training_job", "rank", "cache", "path"} <= exported[
        "shardcache_reader_stall_seconds_total"
    ]
    assert frozenset({"training_job"}) in grouped["shardcache_reader_bytes_total"]
    assert frozenset({"training_job", "rank"}) in grouped["shardcache_reader_stall_seconds_total"]
    assert frozenset({"op"}) in grouped["shardcache_store_requests_total"]


def test_the_dashboard_shows_each_partially_resident_caches_residency_stream_and_hit_ratio(
    exported: dict[str, set[str]],
) -> None:
    grouped = _groupings()
    # the fixture's daemon read a cache twice its room: the series exist, per cache
    assert {"cache", "source"} <= exported["shardcache_cache_shard_reads_total"]
    for metric in ("shardcache_cache_streamed_bytes_total", "shardcache_cache_shard_reads_total"):
        assert frozenset({"cache"}) in grouped[metric], metric
    assert frozenset({"instance", "cache"}) in grouped["shardcache_cache_resident_bytes"]


def test_the_dashboard_shows_read_bytes_by_plane_and_the_data_planes_refusals_by_reason(
    exported: dict[str, set[str]],
) -> None:
    grouped = _groupings()
    # read bytes per daemon and plane, so a daemon whose readers fell back to gRPC shows
    assert "plane" in exported["shardcache_read_bytes_total"]
    assert frozenset({"instance", "plane"}) in grouped["shardcache_read_bytes_total"]
    assert frozenset({"reason"}) in grouped["shardcache_data_refused_total"]
    assert frozenset({"instance"}) in grouped["shardcache_data_fallbacks_total"]


def test_the_dashboard_check_catches_a_misspelled_metric_a_wrong_label_and_a_broken_query(
    exported: dict[str, set[str]],
) -> None:
    text = DASHBOARD.read_text()
    misspelled = json.loads(
        text.replace("shardcache_read_bytes_total", "shardcache_read_byte_total", 1)
    )
    # and, that panel grouping by plane, the label is on no series it selects
    problem, label = dashboard_problems(misspelled, exported)
    assert "shardcache_read_byte_total is not a metric the daemon exports" in problem
    assert "no series of it has the label 'plane'" in label
    # a counter without its _total: the family's name, but no sample of that name
    bare = json.loads(text.replace("shardcache_store_errors_total", "shardcache_store_errors"))
    assert any("shardcache_store_errors is not" in p for p in dashboard_problems(bare, exported))
    wrong_label = json.loads(text.replace("sum by (reason)", "sum by (cause)", 1))
    [problem] = dashboard_problems(wrong_label, exported)
    assert "no series of it has the label 'cause'" in problem
    broken = json.loads(
        text.replace(
            '"expr": "shardcache_store_unpublished_caches',
            '"expr": "(shardcache_store_unpublished_caches',
        )
    )
    [problem] = dashboard_problems(broken, exported)
    assert problem.startswith("panel 'Unpublished caches' A:") and "never closed" in problem
    unfiltered = json.loads(
        text.replace(
            'shardcache_disk_free_bytes{instance=~\\"$instance\\"}', "shardcache_disk_free_bytes"
        )
    )
    [problem] = dashboard_problems(unfiltered, exported)
    assert "shardcache_disk_free_bytes ignores $instance" in problem


def test_parse_promql_finds_selectors_matchers_and_grouping_labels() -> None:
    selectors, grouping = parse_promql(
        'histogram_quantile(0.99, sum by (method, le) (rate(a_b_bucket{x=~"$v", y!="z"}'
        "[$__rate_interval]))) / on (instance) group_left c > 0 and bool d offset 5m"
    )
    assert [(s.metric, s.matchers) for s in selectors] == [
        ("a_b_bucket", {"x": ("=~", "$v"), "y": ("!=", "z")}),
        ("c", {}),
        ("d", {}),
    ]
    assert grouping == {"method", "le", "instance"}
    for bad in ("sum(rate(x[5m])", 'x{a="b"', '{a="b"}', "x{a}", "sum by (a b) (x)"):
        with pytest.raises(ValueError):
            parse_promql(bad)


def test_every_dashboard_panel_has_a_title_a_query_and_a_place_of_its_own() -> None:
    dashboard = _dashboard()
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["multi"] and variables["instance"]["includeAll"]
    panels = list(_panels(dashboard["panels"]))
    assert len({p["id"] for p in panels}) == len(panels)
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel.get("title"), panel
        grid = panel["gridPos"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert grid["x"] + grid["w"] <= 24 and not cells & taken, panel["title"]
        taken |= cells
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in [panel, *panel["targets"]]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all(t["expr"].strip() for t in panel["targets"])
