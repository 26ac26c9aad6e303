"""Prometheus metrics of one server, served at `GET /metrics`.

Each server holds its own `CollectorRegistry`, never the process-wide default one: the
tests run several servers in one process, and each must count for itself. The metrics hold
counts and durations only, never a person key, a text or a credential.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

# The sources of actors/context.py (not imported: metrics must not depend on the pipeline).
CONTEXT_SOURCES = ("conversations", "working", "recent", "sample", "rules")
# A turn is a model call or several (tools), seconds to a minute with a real model.
TURN_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)
# A hello is answered in milliseconds when the server keeps up; the tail shows when it does not.
HELLO_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
GC_GENERATIONS = ("0", "1", "2")
# How a say was matched to what it answers (actors/replies.py): the first two skip the model.
REPLY_MATCHING = ("no_candidate", "just_before", "holding", "rules", "asked")
# Handoffs another node asked of this one, and those this one did (actors/directory.py).
HANDOFF_STAGES = ("asked", "done")
# After what a person was taken from another node (actors/ownership.py, `takeover`).
TAKEOVERS = ("handoff", "lease", "node_gone")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.live_actors = Gauge(
            "stillhere_live_actors",
            "Conversations whose actor runs (on the pool, or a thread each with "
            "--actor-threads 0), or is being activated",
            registry=registry,
        )
        self.actor_threads = Gauge(
            "stillhere_actor_threads",
            "Threads serving conversation actors: the pool's, or one per running actor "
            "with --actor-threads 0",
            registry=registry,
        )
        self.conversations = Gauge(
            "stillhere_conversations",
            "Live conversations this node holds, their actor running or deactivated "
            "(quiet for --actor-idle: no actor, links and stream kept)",
            registry=registry,
        )
        self.links = Gauge(
            "stillhere_links", "Client links attached to a conversation", registry=registry
        )
        self.activations = Counter(
            "stillhere_activations",
            "Actors of deactivated conversations started again from the database",
            registry=registry,
        )
        self.deactivations = Counter(
            "stillhere_deactivations",
            "Actors deactivated after --actor-idle with nothing to do",
            registry=registry,
        )
        self.hellos = Counter(
            "stillhere_hellos",
            "Hellos answered, by whether they resumed a conversation or started a new one",
            ["outcome"],
            registry=registry,
        )
        self.hello_seconds = Histogram(
            "stillhere_hello_seconds",
            "Seconds from a hello being read to its welcome and replay being queued on the link, "
            "by whether it resumed a conversation (a new one may first wait for the last to end)",
            ["outcome"],
            buckets=HELLO_BUCKETS,
            registry=registry,
        )
        self.archives = Counter(
            "stillhere_archives", "Conversations archived, by reason", ["reason"], registry=registry
        )
        self.turn_seconds = Histogram(
            "stillhere_turn_seconds",
            "Seconds from a say being stored to the end of the reply that answers it",
            buckets=TURN_BUCKETS,
            registry=registry,
        )
        self.model_retries = Counter(
            "stillhere_model_retries",
            "First model calls of a turn retried after a failure or an empty answer",
            registry=registry,
        )
        self.echo_cuts = Counter(
            "stillhere_echo_cuts",
            "Repetitions cut from the start of a reply, by whose message it repeated",
            ["of"],
            registry=registry,
        )
        self.echo_regenerations = Counter(
            "stillhere_echo_regenerations",
            "Replies asked for again because they were nothing but a repetition",
            registry=registry,
        )
        self.follow_ons = Counter(
            "stillhere_follow_ons",
            "Lulls and what came of them: sent (a follow-on went out), declined (the draw "
            "said no), cancelled (the person spoke or left first)",
            ["outcome"],
            registry=registry,
        )
        self.analysis_failures = Counter(
            "stillhere_analysis_failures",
            "Analysis model calls that gave nothing usable (failed, late, not the task's shape), "
            "by task and reason",
            ["task", "reason"],
            registry=registry,
        )
        self.reply_matching = Counter(
            "stillhere_reply_matching",
            "Says matched to the assistant message they answer, by how: no candidate, only the "
            "message just before, says that answer nothing, or the rules sure of every say (no "
            "model call), or asked of the analysis model",
            ["how"],
            registry=registry,
        )
        self.context_source_failures = Counter(
            "stillhere_context_source_failures",
            "Context sources that failed while a turn's context was gathered",
            ["source"],
            registry=registry,
        )
        self.loop_lag_seconds = Histogram(
            "stillhere_loop_lag_seconds",
            "Seconds late the event loop ran a timer: time frames, hellos and turns waited "
            "for the loop",
            buckets=HELLO_BUCKETS,  # on the hello's scale, so the two compare bucket by bucket
            registry=registry,
        )
        self.gc_pause_seconds = Histogram(
            "stillhere_gc_pause_seconds",
            "Seconds each garbage collection held the whole server (loop and actors) still, "
            "by generation",
            ["generation"],
            buckets=HELLO_BUCKETS,
            registry=registry,
        )
        self.replayed_events = Counter(
            "stillhere_replayed_events",
            "Events replayed to links that came back with a last_seq",
            registry=registry,
        )
        # Several nodes on one PostgreSQL (docs/architecture.md, "Several nodes").
        self.node = Info(
            "stillhere_node",
            "This server's node name among those sharing its database",
            registry=registry,
        )
        self.handoffs = Counter(
            "stillhere_handoffs",
            "Handoffs of a person to another node: asked of this node, and done by it "
            "(their links closed with moved, the conversation let go and released)",
            ["stage"],
            registry=registry,
        )
        self.takeovers = Counter(
            "stillhere_takeovers",
            "Persons this node took from another node, after a handoff, after the other "
            "node's lease ran out, or with the other node gone",
            ["after"],
            registry=registry,
        )
        self.resends_joined = Counter(
            "stillhere_resends_joined",
            "Says resent while their first write was still queued or in flight, that waited "
            "on it instead of writing again (storage/say_log.py)",
            registry=registry,
        )
        self.fenced_writes = Counter(
            "stillhere_fenced_writes",
            "Writes refused by the owner's fence: this node wrote for a person under an "
            "epoch it no longer held (another node took them, or this node had let them go)",
            registry=registry,
        )
        # Known label values start at 0, so a dashboard sees them before the first event.
        for stage in HANDOFF_STAGES:
            self.handoffs.labels(stage=stage)
        for after in TAKEOVERS:
            self.takeovers.labels(after=after)
        for outcome in ("resumed", "new"):
            self.hellos.labels(outcome=outcome)
            self.hello_seconds.labels(outcome=outcome)
        for reason in ("leave", "idle"):
            self.archives.labels(reason=reason)
        for whose in ("person", "assistant"):
            self.echo_cuts.labels(of=whose)
        for how in REPLY_MATCHING:
            self.reply_matching.labels(how=how)
        for source in CONTEXT_SOURCES:
            self.context_source_failures.labels(source=source)
        for generation in GC_GENERATIONS:
            self.gc_pause_seconds.labels(generation=generation)

    def observe_collection(self, generation: int, seconds: float) -> None:
        """One garbage collection; called in whichever thread it ran (metrics take locks)."""
        self.gc_pause_seconds.labels(generation=GC_GENERATIONS[generation]).observe(seconds)

    def count_analysis_failure(self, task: str, reason: str) -> None:
        self.analysis_failures.labels(task=task, reason=reason).inc()

    def analysis_failure_counts(self) -> dict[str, dict[str, int]]:
        """The failures counted so far, by task, then reason (an eval's report)."""
        counts: dict[str, dict[str, int]] = {}
        for metric in self.analysis_failures.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.value:
                    task, reason = sample.labels["task"], sample.labels["reason"]
                    counts.setdefault(task, {})[reason] = int(sample.value)
        return counts

    def watch(
        self,
        live_actors: Callable[[], int],
        actor_threads: Callable[[], int],
        conversations: Callable[[], int],
        links: Callable[[], int],
    ) -> None:
        """Read the gauges from their source at scrape time, so they can never drift."""
        self.live_actors.set_function(live_actors)
        self.actor_threads.set_function(actor_threads)
        self.conversations.set_function(conversations)
        self.links.set_function(links)

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
