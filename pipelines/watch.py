"""`watch`: exactly one pipeline run per new complete span of the data root.

A span is complete once its folder holds the success marker (config `success_marker`, written
last by the uploader; "" counts every span folder), so a half-uploaded span never starts a run.

What was triggered is recorded in the object store, one JSON object per span at
`<serving_root>/<model_name>/_watch/span-<N>.json`, next to the versions those runs push, so
that every watcher (a restarted process, the next CronJob pod) sees the same history:

    {"span": 3, "state": "triggered", "when": "2025-01-31T02:00:05Z", "how": "kfp http://...",
     "run": "<KFP run id, or the local run's outcome>", "updated": "2025-01-31T02:00:06Z"}

States, and the decisions behind them:
- "started" is written *before* the trigger is called: a crash, kill or restart between the two
  can then never start a second run. A record left "started" (the run may or may not exist) is
  reported and not retried; check the run, then delete the record to run the span again.
- "triggered": the trigger returned (the KFP run id, or the local run's outcome; a local run
  that the gate did not bless was still triggered).
- "failed" (with "error"): the trigger raised. Reported and not retried: bad data or a broken
  spec would fail again on every poll, each time costing a GPU run. Delete the record to retry.
  `watch --once` then exits with 1, so the CronJob's Job shows the failure. An unreachable KFP
  endpoint is checked before any record is written, so an outage only delays the run.
- "present-before-watch": the first poll that finds complete spans and no records at all
  triggers only the newest span and records the older ones under this state. The newest span's
  run trains on the newest `window_spans` spans; one run per historical span would train models
  nobody serves. Run an older span explicitly (`run --set span=N`, `submit --param span=N`).
- Several new spans in one poll (after an outage) each get a run, oldest first: local runs one
  after another, KFP runs are submitted in that order and then run side by side.
- A local run needs the work folder's run lock (pipelines/local/run_lock.py): while another run
  holds it (a `make run` in another terminal), a new span waits, said once, and runs at the
  first poll after that run has ended; nothing is recorded for it meanwhile.
- The store going away between polls is said once, and watch follows the work folder's store
  again (pipelines/local/embedded_store.StoreFollower).
- A release under way (components/base/release.py) is judged at each poll on the live figures
  at `release_metrics_url` and promoted or aborted once its window is over (ReleaseJudge).

One watcher per data root and serving root is assumed: the records are not a lock (the
CronJob's `concurrencyPolicy: Forbid` keeps its polls from overlapping).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

from components.base import console, registry, spans, storage
from components.base.config import PipelineConfig
from components.base.errors import ActionableError
from pipelines.local.run_lock import RunBusy  # stdlib and the base only: light for KFP watchers

_log = logging.getLogger(__name__)

STARTED, TRIGGERED, FAILED, PRESENT = "started", "triggered", "failed", "present-before-watch"
_RECORD = re.compile(r"span-(\d+)\.json$")

Trigger = Callable[[int], str]  # starts the run of one span; returns its run id or outcome


class WatchError(ActionableError):
    """The data root cannot be watched; the message names it and says what to do."""


@dataclasses.dataclass
class Poll:
    complete: list[int]
    new: list[int]
    triggered: dict[int, str] = dataclasses.field(default_factory=dict)
    failed: dict[int, str] = dataclasses.field(default_factory=dict)


class Watcher:
    """Polls `config.data_root`; `trigger` starts a run, `ready` (optional) checks before any
    record is written that the trigger's target answers."""

    def __init__(
        self,
        config: PipelineConfig,
        trigger: Trigger,
        how: str,
        ready: Callable[[], None] | None = None,
        release: Callable[[], None] | None = None,
        judge: Callable[[], None] | None = None,
    ) -> None:
        self.data_root, self.marker = config.data_root, config.success_marker
        self.records_dir = storage.join(config.serving_model_dir, registry.WATCH)
        self.trigger, self.how, self.ready = trigger, how, ready
        self.release = release or (lambda: None)  # what `ready` holds, when no trigger follows
        self.judge = judge or (lambda: None)  # the release under way, judged once a poll
        self.polls = 0
        self.running: int | None = None  # the span whose trigger is under way (for Ctrl-C)
        self._records: dict[str, dict] = {}  # by path: each record is read once per watcher
        self._last_line = ""
        self._waiting = ""  # why new spans wait (another run holds the work folder), said once

    def record_path(self, span: int) -> str:
        return storage.join(self.records_dir, f"span-{span}.json")

    def poll(self) -> Poll:
        self.polls += 1
        every = spans.span_dirs(self.data_root)  # fails fast, naming endpoint and bucket
        if not every:
            raise WatchError(
                f"no spans under {self.data_root}: watch waits for folders span-N/ holding CSV "
                f"files{f' and {self.marker}' if self.marker else ''}. Upload a span there "
                "(the marker last), write one with `add-span`, or point data_root at the data "
                "(--set data_root=... or PIPELINE_DATA_ROOT)."
            )
        complete = sorted(spans.complete_spans(self.data_root, self.marker))
        storage.check_reachable(self.records_dir)  # Beam's own client would retry for minutes
        records = self._read_records()
        new = [span for span in complete if span not in records]
        if len(new) > 1 and not records:  # first start against existing data (module docstring)
            for span in new[:-1]:
                self._write(span, PRESENT)
            console.say(
                f"First start: spans {new[:-1]} were complete before watch started: "
                f"recorded as {PRESENT!r}, not run; the newest, {new[-1]}, runs."
            )
            new = new[-1:]
        waiting = sorted(set(every) - set(complete))
        line = (
            f"spans {complete} complete"
            + (f", {waiting} waiting for {self.marker}" if waiting else "")
            + (f", {new} new" if new else ", nothing new")
        )
        if line != self._last_line:  # quiet while nothing changes
            console.say(f"poll {self.polls}: {line}")
            self._last_line = line
        result = Poll(complete, new)
        for span in new:
            if self.ready and not self._ready(span):
                break
            try:
                self._write(span, STARTED)
            except BaseException:
                self.release()
                raise
            self.running = span
            try:
                result.triggered[span] = self.trigger(span)
            except Exception as error:  # recorded and reported; the other spans still run
                result.failed[span] = f"{type(error).__name__}: {error}"
                self._write(span, FAILED, error=result.failed[span])
                console.error(
                    f"span {span}: the run failed: {result.failed[span]}. Not retried; "
                    f"delete {self.record_path(span)} to run it again."
                )
                continue
            finally:
                self.running = None
            self._write(span, TRIGGERED, run=result.triggered[span])
            console.say(f"span {span}: triggered ({self.how}): {result.triggered[span]}")
        return result

    def _ready(self, span: int) -> bool:
        """Calls `ready` before the span's first record: its errors end the poll with nothing
        recorded, so the next poll tries again; another local run holding the work folder makes
        the span wait (False), said once."""
        try:
            self.ready()
        except RunBusy as error:
            if str(error) != self._waiting:
                console.say(f"span {span} waits: {error.waiting}; it runs at the first poll "
                            "after that run has ended.")  # fmt: skip
                self._waiting = str(error)
            return False
        self._waiting = ""
        return True

    def _read_records(self) -> dict[int, dict]:
        """The records by span; a deleted record is forgotten, so its span runs again."""
        known, self._records = self._records, {}
        for path in storage.list_files(storage.join(self.records_dir, "span-*.json")):
            if not _RECORD.search(path):
                continue
            if path in known:
                self._records[path] = known[path]
                continue
            try:  # written by an earlier watcher: read once, and report what was left open
                record = json.loads(storage.read_bytes(path))
            except (ValueError, OSError) as error:  # a broken record still blocks its span
                record = {"state": "unreadable", "error": str(error)}
            if record.get("state") not in (TRIGGERED, PRESENT):
                console.say(
                    f"record {path}: state {record.get('state')!r} since {record.get('when')} "
                    f"({record.get('error') or record.get('how')}); not retried. Check that "
                    "run, then delete the record to run the span again."
                )
            self._records[path] = record
        return {int(_RECORD.search(path).group(1)): r for path, r in self._records.items()}

    def _write(self, span: int, state: str, **fields: str) -> None:
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        path = self.record_path(span)
        when = self._records.get(path, {}).get("when", now)  # the first attempt's time stays
        record = {
            "span": span,
            "state": state,
            "when": when,
            "how": self.how,
            **fields,
            "updated": now,
        }
        storage.write_bytes(path, json.dumps(record, indent=1).encode())
        self._records[path] = record


def local_trigger(
    config: PipelineConfig, log_path: Path | None, command: str
) -> tuple[Trigger, Callable[[], None], Callable[[], None]]:
    """Runs the pipeline here, one span at a time (a run takes minutes; polling waits). `ready`
    takes the work folder's run lock (RunBusy when another run holds it); the trigger gives it
    back when its run ends, `release` when no trigger follows."""
    from pipelines.local import run_lock

    held = contextlib.ExitStack()

    def ready() -> None:
        held.close()
        held.enter_context(run_lock.exclusive_run(f"{command} (the run of a new span)"))

    def trigger(span: int) -> str:
        from pipelines.local import local_runner
        from pipelines.run_summary import format_summary

        with held:
            console.say(
                f"Running pipeline {config.pipeline_name!r} on span {span} "
                f"(full log: {log_path}) ..."
            )
            summary = local_runner.run_pipeline(dataclasses.replace(config, span=span), log_path)
        console.say(format_summary(summary))
        gate = {True: "blessed", False: "not blessed", None: "not evaluated"}[summary.blessed]
        return f"{gate}, {summary.pushed_path or 'nothing pushed'}"

    return trigger, ready, held.close


def kfp_trigger(
    config: PipelineConfig, endpoint: str, package: str | None, experiment: str
) -> tuple[Trigger, Callable[[], None]]:
    """Submits a run per span: of the pipeline's newest version on the server (config
    `pipeline_name`; what `make submit`/`make schedule`, CI after a merge, uploaded last), or
    of `package`, uploaded first when it changed. `data_root` goes with `span`: the run must
    read the root this watcher saw the span in, whatever root the spec was compiled with."""
    from pipelines.kubeflow import kfp_client

    def ready() -> None:
        if package is None:
            kfp_client.check_pipeline(endpoint, config.pipeline_name)
            return
        kfp_client.check_endpoint(endpoint)
        if not Path(package).is_file():
            raise kfp_client.KubeflowError(
                f"no compiled spec at {package}: run `make compile` (kubeflow/README.md, "
                "section 2), or leave out --package to run the pipeline's newest version."
            )

    def trigger(span: int) -> str:
        parameters = {"span": span, "data_root": config.data_root}
        if package is None:
            return kfp_client.submit_newest(endpoint, config.pipeline_name, parameters,
                                            experiment)  # fmt: skip
        return kfp_client.submit(endpoint, package, parameters, experiment)

    return trigger, ready


def run(watcher: Watcher, interval: int, once: bool, sleep=time.sleep, follower=None) -> int:
    """Polls until stopped (`once`: a single poll). Exit code: 1 when a trigger of the last poll
    failed. The first poll's errors end the command (a wrong root or endpoint shows at once);
    later ones are reported and the next poll tries again, so a blip does not stop a watcher.
    `follower` (embedded_store.StoreFollower) handles a store that stopped answering: it says so
    once, and the poll is tried again at once when it has found or started the folder's store."""
    console.say(
        f"Watching {watcher.data_root} (marker {watcher.marker or 'none'}) "
        + ("once" if once else f"every {interval} s; Ctrl-C stops")
        + f"; records in {watcher.records_dir}."
    )
    try:
        while True:
            try:
                result = _poll(watcher, follower)
            except ActionableError as error:
                if once or watcher.polls == 1:
                    raise
                if follower is not None and follower.lost:
                    _log.warning("poll %s failed: %s", watcher.polls, error)  # said once
                else:
                    console.error(
                        f"poll {watcher.polls} failed: {error}; next poll in {interval} s."
                    )
            else:
                if once:
                    return 1 if result.failed else 0
            sleep(interval)
    except KeyboardInterrupt:
        if watcher.running is None:
            console.say(f"\nStopped watching after {watcher.polls} poll(s).")
            return 0
        console.error(
            f"\nInterrupted during the run of span {watcher.running}: its record "
            f"{watcher.record_path(watcher.running)} stays {STARTED!r} and is not "
            "retried; delete it to run the span again."
        )
        return 130


def _poll(watcher: Watcher, follower) -> Poll:
    """One poll; once more at once when the follower has just found the store again. Then the
    release under way, if any, is judged."""
    try:
        result = watcher.poll()
        watcher.judge()  # reads the store too: a store gone away is the follower's business
    except ActionableError as error:
        if follower is None or not follower.failed(error):
            raise
        result = watcher.poll()
        watcher.judge()
    if follower is not None:
        follower.answered()
    return result


class ReleaseJudge:
    """Judges the release under way on its live figures and promotes or aborts it
    (components/base/release.judge_release). A release that waits, or figures that cannot be
    read, are said once per release; `stable` keeps serving meanwhile."""

    def __init__(self, config: PipelineConfig) -> None:
        self.config = config
        self._said: set[str] = set()  # what was said about the current release (or outage)
        self._release: tuple | None = None
        self._cluster = None  # release_router "istio": the cluster's release, made once

    def __call__(self) -> None:
        from components.base import live_release, release
        from pipelines.serving import cluster, cluster_release

        folder, name = self.config.serving_model_dir, self.config.model_name
        try:
            if self.config.release_router == "istio":
                self._cluster = self._cluster or cluster_release.ClusterRelease(folder, name)
                judged = self._cluster.poll()
            else:
                judged = release.judge_release(folder, name, self.config.metrics_url())
        except (live_release.MetricsUnavailable, cluster.ClusterUnavailable,
                registry.RegistryError) as error:  # fmt: skip
            self._once(f"release: {error}", error=True)
            return
        self._said = {line for line in self._said if not line.startswith("release: ")}
        if judged is None:
            return
        state, verdict = judged
        if self._release != (state.canary, state.release.get("started")):  # another release
            self._release, self._said = (state.canary, state.release.get("started")), set()
        figures, why = json.dumps(verdict.figures, sort_keys=True), "; ".join(verdict.reasons)
        if verdict.action == live_release.WAIT:
            policy = state.release["policy"]
            self._once(f"release of canary {state.canary} beside stable {state.stable}: judged "
                       f"after {policy['min_requests']} canary requests and "
                       f"{policy['min_minutes']:g} min (so far: {why})")  # fmt: skip
        elif verdict.action == live_release.PROMOTE:
            console.say(f"Canary {state.canary} promoted: stable now, {state.stable} kept loaded "
                        f"for a rollback ({why}). Figures: {figures}")  # fmt: skip
        else:
            console.say(f"Canary {state.canary} aborted and unloaded; stable {state.stable} "
                        f"serves on: {why}. Figures: {figures}")  # fmt: skip

    def _once(self, line: str, error: bool = False) -> None:
        key = line.split(" (so far: ")[0]  # a waiting release: said once, not at each count
        if key in self._said:
            _log.info("%s", line)
            return
        self._said.add(key)
        (console.error if error else console.say)(line)


def main(
    config: PipelineConfig,
    interval: int,
    once: bool,
    endpoint: str | None,
    package: str | None,
    experiment: str,
    log_path: Path | None,
    command: str = "tkp watch",
) -> int:
    """`watch` as the CLI calls it: KFP when `endpoint` is given, else local runs inside the
    object store (the embedded one is started when none is configured)."""
    if endpoint:
        trigger, ready = kfp_trigger(config, endpoint, package, experiment)
        watcher = Watcher(config, trigger, f"kfp {endpoint}", ready, judge=ReleaseJudge(config))
        return run(watcher, interval, once)
    from pipelines.local import embedded_store

    with embedded_store.object_store(config) as store:
        trigger, ready, release = local_trigger(config, log_path, command)
        follower = embedded_store.StoreFollower(store, console.say, lambda: "watch keeps polling")
        watcher = Watcher(config, trigger, "local", ready, release, judge=ReleaseJudge(config))
        return run(watcher, interval, once, follower=follower)
