"""The flap bench, small: real server, reference phones on flapping links, no baselines.

It asserts what must hold at any size (nothing lost or duplicated, every reconnect within
the window resumed), never timings: those are the bench's to report (bench/README.md).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench import flap, flap_plot, flap_tls, procs
from bench.flap_metrics import bounded_percentiles
from bench.flap_throughput import measure as measure_throughput


@pytest.mark.timeout(110)
@pytest.mark.parametrize("transport", ["ws", "mixed"])
async def test_flapping_phones_lose_and_duplicate_nothing(transport: str, tmp_path: Path) -> None:
    args = flap.parse_args(
        [
            "--clients", "20", "--duration", "10s", "--transport", transport,
            "--rss-settle", "0.5s", "--seed", "7", "--think", "2s", "--flap-every", "3s",
            "--rehearsal-latency", "100ms", "--rehearsal-rate", "40",
            "--no-baselines", "--no-progress", "--settle-timeout", "60s", "--timeout", "100s",
        ]
    )  # fmt: skip
    report = await flap.measure(args)

    assert report["ramp_failed"] == 0
    assert report["live_conversations"] == 20
    assert report["says"] > 20 and report["link_events"], "the phones talked and flapped"
    for kind in ("tunnel", "handover"):  # the server is not told of these drops
        assert report["cuts"][f"{kind}_held_open"] > 0, kind
    assert report["reconnects"] > 0
    assert report["resumed"] == report["reconnects"], report["examples"]
    for key in flap.CORRECTNESS_KEYS:
        assert report[key] == 0, (key, report["examples"])
    assert report["unsettled"] == 0
    assert report["phone_failures"] == {}
    assert report["frames_tapped_before_dedup"], "the bench sees frames before the client"
    assert report["server_hello_ms"]["n"] > 0, "the server's own hello timings were read"
    assert report["server_loop_lag_ms"]["n"] > 0, "the server's loop lag was read"
    assert report["server_gc0_ms"] is not None, "the server's collections were read"
    bench_lag = report["bench_loop_lag_ms"]
    assert bench_lag["n"] > 0, "the bench's own loop was probed while the phones flapped"
    assert 0 <= bench_lag["p50"] <= bench_lag["p99"] <= bench_lag["max"]
    bench_gc = report["bench_gc"]  # held off while the phones flapped, then collected
    assert bench_gc["mode"] == "off" and bench_gc["collections"] == [0, 0, 0]
    assert bench_gc["freed_after_run"] > 0 and "rss_mb_grown" in bench_gc
    assert report["server_resends_joined"] is not None, "the server's count was read"
    for line in ("server loop lag ≤", "bench loop lag", "server collector   gen0 ", "resends"):
        assert line in flap.table(report)
    series, cores = report["series"], psutil.cpu_count()
    assert series["t"][0] >= 0.9, "each tick ends the second it describes, the first too"
    for key in flap.SERIES_CORES:  # each tick says how busy the server, bench and rest were
        assert len(series[key]) == len(series["t"]) > 0
        assert 0 <= min(series[key]) <= max(series[key]) <= cores + 0.1, key  # each a second
        assert key == "cores_steal" or max(series[key]) > 0, key  # a machine may have no steal
    split = report["resume_ms_by_steal"]  # every resume falls in one second or the other
    assert split["quiet"]["n"] + split["stolen"]["n"] == report["resume_ms"]["n"]
    png = tmp_path / "flap.png"
    flap_plot.plot(png, report, report["_resume_points"])
    assert png.read_bytes().startswith(b"\x89PNG"), "the plot is drawn, cores panel and all"
    stop = report["server_stop"]
    assert stop["exit_code"] == 0 and not stop["killed"] and stop["log_problems"] == 0


@pytest.mark.timeout(150)
async def test_flapping_over_tls_beside_plain_loses_nothing() -> None:
    """`--tls`: the same phones flapped again against stillhere over TLS, verified against
    the run's own authority; both runs resume every reconnect and lose nothing."""
    args = flap.parse_args(
        [
            "--clients", "12", "--duration", "6s", "--rss-settle", "0.5s", "--seed", "5",
            "--think", "2s", "--flap-every", "2s", "--rehearsal-latency", "100ms",
            "--rehearsal-rate", "40", "--no-baselines", "--no-progress", "--tls",
            "--settle-timeout", "60s", "--timeout", "140s",
        ]
    )  # fmt: skip
    report = await flap.measure(args)
    side = report["tls"]
    assert side["plain"]["url"].startswith("http://")
    assert side["tls"]["url"].startswith("https://")
    for run in ("plain", "tls"):
        assert side[run]["reconnects"] > 0
        assert side[run]["resumed"] == side[run]["reconnects"]
        assert side[run]["lost"] == 0
    assert flap_tls.problems(report) == []
    assert "over TLS vs plain" in flap.table(report)


@pytest.mark.timeout(240)
async def test_a_storm_and_the_baselines_run_end_to_end() -> None:
    """The whole run, small: the throughput rounds on all four servers, stillhere flapped and
    then stormed, each baseline flapped. The baselines behave as the designs they stand for:
    link-bound resumes nothing, stateless reload resumes from its database."""
    args = flap.parse_args(
        [
            "--clients", "12", "--duration", "6s", "--baseline-duration", "6s", "--storm",
            "--transport", "ws", "--rss-settle", "0.5s", "--seed", "5", "--think", "1s",
            "--flap-every", "2s", "--rehearsal-latency", "50ms", "--rehearsal-rate", "80",
            "--throughput-phones", "4", "--throughput-says", "5", "--throughput-rounds", "1",
            "--throughput-warmup", "1", "--no-progress", "--settle-timeout", "60s",
            "--storm-timeout", "60s", "--timeout", "220s",
        ]
    )  # fmt: skip
    report = await flap.measure(args)

    assert report["storm_s"] is not None and report["storm_not_resumed"] == 0
    assert report["storm"]["reconnect_ms"]["n"] == 12, "every phone came back after the storm"
    for key in flap.CORRECTNESS_KEYS:
        assert report[key] == 0, (key, report["examples"])
    baselines = report["baselines"]
    for server in ("stillhere", "stillhere-per-piece", "link-bound", "stateless"):
        assert baselines["turns_per_s"][server] > 0, server
    assert baselines["stillhere_turns_over_link_bound"] > 0
    resumed = baselines["resume_fraction"]
    assert resumed["stillhere"] == 1.0 and resumed["stateless"] == 1.0
    assert baselines["flap"]["link-bound"]["reconnects"] > 0 and resumed["link-bound"] == 0.0
    for server, rss in baselines["rss_peak_mb"].items():
        assert rss > 0, server
    stateless = baselines["flap"]["stateless"]
    assert stateless["lost_says"] == stateless["stored_twice"] == 0
    assert "storm" in flap.table(report)


def test_hello_percentiles_are_bounded_by_the_buckets_of_the_window() -> None:
    before = {0.001: 10.0, 0.01: 10.0, 0.1: 10.0, float("inf"): 10.0}  # the ramp's hellos
    after = {0.001: 60.0, 0.01: 105.0, 0.1: 109.0, float("inf"): 110.0}
    figures = bounded_percentiles(before, after)
    # 100 hellos in the window: 50 under 1 ms, 45 more under 10 ms, 4 under 100 ms, 1 above.
    assert figures == {
        "n": 100.0,
        "p50_le": 1.0,
        "p95_le": 10.0,
        "p99_le": 100.0,
        "p100_le": None,  # the longest is above the last finite bound
    }
    assert bounded_percentiles(after, after) == {
        "n": 0.0,
        "p50_le": None,
        "p95_le": None,
        "p99_le": None,
        "p100_le": None,
    }
    assert bounded_percentiles({}, {0.1: 1.0, float("inf"): 2.0}, (99,))["p99_le"] is None


def test_the_baselines_show_stillhere_per_piece_beside_the_others() -> None:
    def server(*rounds: float) -> dict[str, Any]:
        return {"turns_per_s": sorted(rounds)[1], "rounds_turns_per_s": list(rounds)}

    # Medians alone would give 300 / 400 = 0.75; round by round, 0.6, 0.8 and 0.825.
    tput = {
        "stillhere": server(300.0, 280.0, 330.0),
        "stillhere-per-piece": server(200.0, 175.0, 200.0),
        "link-bound": server(500.0, 350.0, 400.0),
        "stateless": server(100.0, 100.0, 100.0),
    }
    flapped = {"link-bound": {"resume_fraction": 0.0, "lost_says": 3}, "stateless": {}}
    report = {"resume_fraction": 1.0, "lost_says": 0, "baselines": {"throughput": tput}}
    report["baselines"] |= {"flap": flapped} | flap._ratios(report, report["baselines"])
    assert report["baselines"]["stillhere_turns_over_link_bound"] == 0.8
    assert report["baselines"]["stillhere_turns_over_link_bound_rounds"] == [0.6, 0.8, 0.825]
    assert report["baselines"]["stillhere_per_piece_turns_over_link_bound"] == 0.5
    rows = {line.split()[0]: line.split()[1:] for line in flap.baseline_rows(report)[1:]}
    assert rows["stillhere"][:4] == ["300.00", "0.80", "1.00", "-"]
    assert rows["stillhere-per-piece"] == ["200.00", "0.50"] + ["-"] * 9
    assert rows["link-bound"][4:6] == ["3", "0"]


def test_actor_threads_reach_every_stillhere_and_add_one_to_the_timed_rounds() -> None:
    """`--actor-threads 4,0`: every stillhere on a pool of 4, and one more stillhere with a
    thread per actor timed with the others; the baselines as they are."""
    servers = flap.throughput_servers([4, 0])
    assert list(servers) == [*flap.THROUGHPUT_SERVERS, "stillhere-actor-threads-0"]
    for label, (name, options) in servers.items():
        if name != "stillhere":
            assert options == flap.THROUGHPUT_SERVERS[label][1]
        elif label == "stillhere-actor-threads-0":
            assert options[-2:] == ["--actor-threads", "0"]
        else:
            assert options[-2:] == ["--actor-threads", "4"]
    assert flap.throughput_servers(None) == flap.THROUGHPUT_SERVERS
    assert flap.actor_options(None) == []


@pytest.mark.timeout(110)
async def test_a_timed_round_reports_each_sides_cpu_per_turn_and_the_loops_time(
    tmp_path: Path,
) -> None:
    name, options = flap.THROUGHPUT_SERVERS["stillhere"]  # as the bench runs it
    server = procs.start(name, tmp_path, latency=0.0, rate=0.0, extra=options)
    try:
        await procs.wait_ready(server)
        with procs.RssSampler(server) as rss:
            # 300 turns: enough PostgreSQL work (about 0.3 ms a turn) that the kernel's
            # 10 ms CPU ticks surely see some of it.
            timed = await measure_throughput(
                server.base_url,
                6,
                50,
                60.0,
                warmup=1,
                readings=partial(flap.throughput_readings, server),
            )
    finally:
        procs.stop(server)
    figures = flap.throughput_figures([timed], rss)
    assert figures["turns"] == 300 and not figures["errors"]
    per_turn = figures["cpu_ms_per_turn"]
    # Every side works for a turn: the server, its PostgreSQL (the say and the reply are
    # stored), the bench (its phones).
    assert per_turn["server"] > 0 and per_turn["postgres"] > 0 and per_turn["bench"] > 0
    assert 0 <= figures["steal_cores"] <= psutil.cpu_count()
    if procs.main_thread_sched_s(psutil.Process()):  # Linux: schedstat is there to read
        assert 0 < figures["loop_on_core"] <= 1.05
        assert figures["loop_waiting_for_core"] >= 0


def test_a_round_without_turns_leaves_the_others_paired() -> None:
    tput = {
        "stillhere": {"rounds_turns_per_s": [300.0, None, 330.0]},
        "link-bound": {"rounds_turns_per_s": [400.0, 500.0, 300.0]},
    }
    assert flap.paired_ratios(tput, "stillhere", "link-bound") == [0.75, 1.1]
    assert flap.paired_ratios(tput, "stillhere", "stateless") == []
    assert flap.median_or_none([]) is None


def test_resumes_are_split_by_the_steal_of_the_second_they_fell_in() -> None:
    series = {"t": [1.0, 2.0, 3.0, 4.0], "cores_steal": [0.0, 0.5, 0.09, 0.1]}
    # (s, ms): in the 1st, 2nd, 3rd and 4th seconds, and one after the last tick.
    points = [(0.4, 2.0), (1.5, 80.0), (1.9, 60.0), (2.5, 3.0), (3.2, 40.0), (4.7, 50.0)]

    split = flap.resume_by_steal(points, series)

    assert split["quiet"]["n"] == 2 and split["quiet"]["p50"] == 2.5
    assert split["stolen"]["n"] == 4 and split["stolen"]["seconds"] == 2
    assert split["stolen"]["p50"] == 55.0
    text = flap.table(
        {"resume_ms_by_steal": split, "clients": 1, "transport": "ws", "duration_s": 1, "seed": 1,
         "rehearsal": {"latency_s": 0, "rate_words_per_s": 0}, "machine": {"cpu_count": 2}}
    )  # fmt: skip
    assert "no steal" in text and "steal ≥ 0.1" in text
    assert flap.resume_by_steal(points, {})["quiet"]["n"] == 0  # no series: nothing to split
