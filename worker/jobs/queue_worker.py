"""``RunWorker``: RQ's ``SimpleWorker`` with its per-job bookkeeping in fewer Redis commands and round trips.

RQ writes much of its bookkeeping again and again for every job: the worker's own key is renewed five times a job
(before and after the blocking pop, before the job, after it, with the suspension check), its state written idle
twice, the job's start is two transactions, and its end reads its dependents and counts the worker's jobs, and the
end of a job with no summary to keep (``result_ttl=0``) removes it from every registry RQ has. A run
of ``true`` cost RQ about 57 commands. ``RunWorker`` keeps RQ's data model — the job hash, the started-job registry
and the execution records a dying worker leaves for the stranded-job sweep (``orchestrator.dispatch.stranded``),
the worker's key with its state — and writes each piece once:

* the worker's key is renewed only when the expiry it holds would fall more than ``BEAT_SLACK_SECONDS`` short of
  what RQ asks for (a longer job's longer time to live is still written before it starts), and its state only when
  it changes; ``rq suspend`` is looked for every ``SUSPENSION_LOOK_SECONDS`` rather than before every job;
* the job's start (its execution, the started-job registry, its status) is one transaction;
* a job that returned ends in one transaction: its summary saved for ``result_ttl`` (what the dispatcher enqueues
  runs with) or, with none to keep (``result_ttl=0``), its hash deleted — no registry holds it then but the
  started-job one, which RQ's own delete would look through — and its execution gone; the worker's counts of jobs
  and working time (``rq info``'s) are not kept. A job that repeats, or failed, ends as RQ ends it.

Skillrun's jobs have no dependents (nothing is enqueued with ``depends_on``), so the end does not look for them.
"""

from __future__ import annotations

import time
from typing import Any

from redis.client import Pipeline
from rq import SimpleWorker
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.rate_limit import release_slot
from rq.registry import StartedJobRegistry
from rq.utils import now
from rq.worker import WorkerStatus

BEAT_SLACK_SECONDS = 60
"""How much sooner than RQ asks the worker's key may expire before it is renewed (RQ asks for 480 s between jobs
and blocks 405 s at most in its pop, so an idle worker's key never lapses)."""
SUSPENSION_LOOK_SECONDS = 1.0
"""How often the worker looks whether ``rq suspend`` suspended the workers."""
COMMANDS_POLL_SECONDS = 1.0
"""How long the thread that reads the worker's command channel (``rq``'s kill and stop commands) waits at most for
one: a stopping worker waits that long for it at most (RQ's own 60 s held a stop for up to a minute, since redis-py
joins the thread on stop, and the thread waits out its whole poll when it is between subscriptions)."""


class RunWorker(SimpleWorker):
    """A ``SimpleWorker`` that writes RQ's bookkeeping once per job (see the module's description)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._beat_until = float("-inf")
        self._suspension_looked = float("-inf")

    def subscribe(self) -> None:
        """RQ's subscription to the worker's command channel, read with a short poll (``COMMANDS_POLL_SECONDS``)."""
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(sleep_time=COMMANDS_POLL_SECONDS, daemon=True,
                                                       exception_handler=self._pubsub_exception_handler)

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        timeout = timeout or self.worker_ttl + 60
        if self._beat_until >= time.monotonic() + timeout - BEAT_SLACK_SECONDS:
            return
        super().heartbeat(timeout, pipeline)
        self._beat_until = time.monotonic() + timeout

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        if state != self._state:
            super().set_state(state, pipeline)

    def check_for_suspension(self, burst: bool) -> None:
        if time.monotonic() - self._suspension_looked >= SUSPENSION_LOOK_SECONDS:
            super().check_for_suspension(burst)
            self._suspension_looked = time.monotonic()

    def prepare_execution(self, job: Job) -> Execution:
        """The execution, the worker busy, its key renewed for the job's time, the job started: one transaction
        (RQ's ``prepare_execution`` and ``prepare_job_execution`` together)."""
        with self.connection.pipeline() as pipeline:
            ttl = self.get_heartbeat_ttl(job)
            execution = Execution.create(job, ttl, pipeline=pipeline, worker_name=self.name)
            self.executions[execution.id] = execution
            self.set_state(WorkerStatus.BUSY, pipeline=pipeline)
            self.heartbeat(ttl, pipeline=pipeline)
            job.prepare_for_execution(self.name, pipeline=pipeline)
            pipeline.persist(job.key)
            if len(self.queues) == 1:
                pipeline.lrem(Queue(job.origin, connection=self.connection).intermediate_queue_key, 1, job.id)
            pipeline.execute()
        return execution

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        """Written with the execution (``prepare_execution``)."""
        self.procline(f"Processing {job.func_name} from {job.origin} since {time.time()}")

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        """The job's end time (its hash is written, or deleted, in the transaction that ends it)."""
        job.ended_at = job.last_heartbeat = now()

    def handle_job_success(self, job: Job, queue: Queue, started_job_registry: StartedJobRegistry,
                           execution: Execution) -> None:
        """RQ's end of a job that returned, in one transaction: its summary kept (``result_ttl``, in the finished-job
        registry) or, with none to keep, its hash deleted; its execution gone."""
        if job.repeats_left:
            super().handle_job_success(job, queue, started_job_registry, execution)
            return
        result_ttl = job.get_result_ttl(self.default_result_ttl)
        with self.connection.pipeline() as pipeline:
            if result_ttl == 0:
                pipeline.delete(job.key, job.dependents_key)
            else:
                job._handle_success(result_ttl, pipeline=pipeline, worker_name=self.name, execution_id=execution.id,
                                    execution_started_at=execution.created_at, execution_ended_at=job.ended_at)
                job.cleanup(result_ttl, pipeline=pipeline, remove_from_queue=False)
            self.cleanup_execution(job, pipeline=pipeline, execution=execution)
            pipeline.execute()
        job._status = JobStatus.FINISHED
        release_slot(job)
