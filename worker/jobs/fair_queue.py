"""Teams take turns on a shared queue: each team has at most ``SHARE`` runs waiting in an RQ queue, the rest wait in
the team's own line beside it, and a team's next run joins the queue (at its end, behind the other teams' turns)
when one of its runs leaves it.

RQ serves a queue first come, first served: a team that queues a thousand runs would hold back every other team's
next run behind all of them. So a fresh run of a team does not go onto the RQ queue (``rq:queue:<name>``) when the
team already has ``SHARE`` runs there, or already has runs in its line; it goes to the end of that line
(``skillrun:fair:<queue>:line:<team>``). Each team's line is a FIFO; the RQ queue holds at most ``SHARE`` runs per
team, so it serves the teams in turn (round robin), each in its own order. A worker that takes a run from the queue
moves its team's next run from the line to the queue (``TeamGate.started``), in one script: no run is ever in
neither place, and none in both.

A team's cap on runs at once (its quota's ``max_running``) holds here too: a run joins the queue only while the
team's runs started and waiting in the queue are fewer than the cap, so past it the team's runs wait in its line
(not refused), and each run that ends lets the next one in (``TeamGate.ended``). The cap counts the team's runs in
every queue (the shared one and the nodes'), and a run that ends moves the team's line on in each. The cap is the one the team's last
submission carried (``skillrun:fair:caps``): a changed quota holds from the team's next submission.

Runs that go back to a queue — a retry, a stranded job put back, a run forwarded to its workspace's node — go to
its front directly, as before: they had their turn. A priority run of a team goes to the front of the queue when its
team has room there, else takes its team's turn in the queue (the run it displaces goes back to the front of the
line): it starts before the team's other runs, never before another team's turn.

A run cancelled while it waits is taken out of its line (``TeamGate.withdraw``). The queue dispatcher's sweep
(``TeamGate.sweep``, every few seconds) repairs what a worker that died between
taking a run and noting it left: a run it took counts no more, and the team's line moves on.

Keys: ``skillrun:fair:queues`` (the queues with lines), ``skillrun:fair:<queue>:teams`` (the teams with a line
there), ``…:line:<team>`` (job ids), ``…:in:<team>`` (the team's job ids waiting in the RQ queue),
``skillrun:fair:team:<team>:in`` (the same in every queue: job id → the queue's key),
``skillrun:fair:caps`` (team → cap on runs at once; 0 none). A line, and a queue's team set, is gone once empty.
"""

from __future__ import annotations

from typing import Any

import redis
from rq import Queue
from rq.serializers import JSONSerializer

SHARE = 1
"""Runs of one team waiting in an RQ queue at most: a run of another team waits behind at most this many of each
team's (measured: ``benchmarks/fairness.py``)."""
NO_TEAM = "~"
"""The team of runs without an owner (the command line's): not a valid team name."""
PREFIX = "skillrun:fair"
QUEUES = f"{PREFIX}:queues"
CAPS = f"{PREFIX}:caps"

_ROOM = """
local function add(job)
    redis.call('SADD', KEYS[2], job)
    redis.call('HSET', KEYS[7], job, KEYS[1])
end
local function rem(job)
    redis.call('SREM', KEYS[2], job)
    redis.call('HDEL', KEYS[7], job)
end
local function room(cap)
    if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[3]) then
        return false
    end
    return cap <= 0 or redis.call('ZCARD', KEYS[5]) + redis.call('HLEN', KEYS[7]) < cap
end
local function promote(cap)
    if redis.call('LLEN', KEYS[3]) == 0 then
        redis.call('SREM', KEYS[4], ARGV[2])
        return 0
    end
    cap = cap or tonumber(redis.call('HGET', KEYS[6], ARGV[2]) or '0')
    local moved = 0
    while room(cap) do
        local job = redis.call('LPOP', KEYS[3])
        if not job then
            break
        end
        redis.call('RPUSH', KEYS[1], job)
        add(job)
        moved = moved + 1
    end
    if redis.call('LLEN', KEYS[3]) == 0 then
        redis.call('SREM', KEYS[4], ARGV[2])
    end
    return moved
end
"""

ADMIT = _ROOM + """
local cap = tonumber(ARGV[6])
if cap > 0 then
    redis.call('HSET', KEYS[6], ARGV[2], cap)
else
    redis.call('HDEL', KEYS[6], ARGV[2])
end
if redis.call('LLEN', KEYS[3]) == 0 and room(cap) then
    if ARGV[4] == '1' then
        redis.call('LPUSH', KEYS[1], ARGV[1])
    else
        redis.call('RPUSH', KEYS[1], ARGV[1])
    end
    add(ARGV[1])
    return 1
end
local displaced = ARGV[1]
if ARGV[4] == '1' then
    for _, job in ipairs(redis.call('SMEMBERS', KEYS[2])) do
        local at = redis.call('LPOS', KEYS[1], job)
        if at then
            redis.call('LSET', KEYS[1], at, ARGV[1])
            rem(job)
            add(ARGV[1])
            displaced = job
            break
        end
    end
    redis.call('LPUSH', KEYS[3], displaced)
else
    redis.call('RPUSH', KEYS[3], ARGV[1])
end
redis.call('SADD', KEYS[4], ARGV[2])
redis.call('SADD', KEYS[8], ARGV[5])
return 0
"""
"""``KEYS = [rq queue, in, line, teams, team's running runs, caps, the team's jobs in any RQ queue, queues]``, ``ARGV = [job id, team, share, at
front '1'|'0', queue name, cap]``: 1 when the job went onto the RQ queue, 0 to the team's line. A job at the front
(a priority run) without room takes the place of one of its team's jobs in the RQ queue, which goes to the front
of the line."""

PROMOTE = _ROOM + """
if ARGV[1] ~= '' then
    rem(ARGV[1])
end
if ARGV[4] == '1' then
    for _, job in ipairs(redis.call('SMEMBERS', KEYS[2])) do
        if not redis.call('LPOS', KEYS[1], job) then
            rem(job)
        end
    end
    local held = redis.call('HGETALL', KEYS[7])
    for i = 1, #held, 2 do
        if not redis.call('LPOS', held[i + 1], held[i]) then
            redis.call('HDEL', KEYS[7], held[i])
        end
    end
end
return promote(nil)
"""
"""``KEYS`` as ``ADMIT``'s (but the last), ``ARGV = [job id that left the RQ queue or '', team, share, '1' to forget
the team's jobs no longer in the RQ queue (the sweep)]``: how many runs moved from the line to the queue."""

ENDED = _ROOM + """
local cap = tonumber(redis.call('HGET', KEYS[6], ARGV[2]) or '0')
return {promote(cap), cap > 0 and 1 or 0}
"""
"""``KEYS`` as ``PROMOTE``'s, ``ARGV = ['', team, share]``: a run of the team ended; ``[how many runs moved from
the line to the queue, 1 when the team has a cap on runs at once (its lines in other queues may move too) else 0]``."""

WITHDRAW = _ROOM + """
local gone = redis.call('LREM', KEYS[3], 0, ARGV[1])
if gone == 0 and redis.call('LREM', KEYS[1], 0, ARGV[1]) > 0 then
    rem(ARGV[1])
    gone = 1
end
promote(nil)
return gone
"""
"""``KEYS`` as ``PROMOTE``'s, ``ARGV = [job id, team, share]``: 1 when the job was taken out of the team's line or
the RQ queue (its run was cancelled while it waited), and the line moves on."""


def team_of(owner: str | None) -> str:
    return owner or NO_TEAM


class TeamGate:
    """The lines of the teams beside the RQ queues of one Redis (see the module's description)."""

    def __init__(self, connection: redis.Redis, running_key: Any, *, share: int = SHARE) -> None:
        """``running_key(team)``: the key of the sorted set of a team's started runs (the run store's)."""
        self.redis = connection
        self.running_key = running_key
        self.share = share
        self._admit = connection.register_script(ADMIT)
        self._promote = connection.register_script(PROMOTE)
        self._ended = connection.register_script(ENDED)
        self._withdraw = connection.register_script(WITHDRAW)

    def _keys(self, queue: str, team: str) -> list[str]:
        return [f"rq:queue:{queue}", f"{PREFIX}:{queue}:in:{team}", line_key(queue, team), teams_key(queue),
                self.running_key(team), CAPS, team_in_key(team)]

    def admit(self, queue: str, team: str, job_id: str, *, at_front: bool = False, cap: int = 0,
              client: Any = None) -> None:
        """A fresh run's job: onto the RQ queue if its team has room there, else to the end (``at_front``: the
        front) of the team's line. In ``client`` (a pipeline, say) if given."""
        keys = [*self._keys(queue, team), QUEUES]
        args = [job_id, team, self.share, int(at_front), queue, cap]
        if client is None:
            self._admit(keys=keys, args=args)
        else:  # EVAL in a transaction: a registered script would cost a SCRIPT EXISTS round trip on every execute
            client.eval(ADMIT, len(keys), *keys, *args)

    def started(self, queue: str, team: str, job_id: str) -> int:
        """A worker took ``job_id`` off the RQ queue ``queue``: the team's next runs join the queue while it has
        room; how many did."""
        return int(self._promote(keys=self._keys(queue, team), args=[job_id, team, self.share, 0]))

    def ended(self, queue: str, team: str) -> int:
        """A run of ``team`` ended: under a cap on runs at once, its next run may join the queue — its own queue's,
        or (a team with a cap) another's where the team has a line."""
        moved, capped = self._ended(keys=self._keys(queue, team), args=["", team, self.share])
        if capped:
            for other in (q.decode() for q in self.redis.smembers(QUEUES)):
                if other != queue and self.redis.sismember(teams_key(other), team):
                    moved += int(self._promote(keys=self._keys(other, team), args=["", team, self.share, 0]))
        return moved

    def withdraw(self, queue: str, team: str, job_id: str) -> bool:
        """Take a job whose run was cancelled while it waited out of its team's line (or the RQ queue), so that
        cancelled runs never pile up there; whether it was found."""
        return bool(self._withdraw(keys=self._keys(queue, team), args=[job_id, team, self.share]))

    def sweep(self) -> int:
        """Every line: the jobs a dead worker took count no more, and the line moves on; how many runs joined a
        queue."""
        moved = 0
        for queue in (q.decode() for q in self.redis.smembers(QUEUES)):
            teams = [t.decode() for t in self.redis.smembers(teams_key(queue))]
            for team in teams:
                moved += int(self._promote(keys=self._keys(queue, team), args=["", team, self.share, 1]))
            if not teams:
                self.redis.srem(QUEUES, queue)
        return moved

    def waiting(self, queue: str) -> list[str]:
        """The job ids waiting in the teams' lines of ``queue``."""
        jobs: list[str] = []
        for team in self.redis.smembers(teams_key(queue)):
            jobs += [job.decode() for job in self.redis.lrange(line_key(queue, team.decode()), 0, -1)]
        return jobs

    def depth(self, queue: str) -> int:
        """How many jobs wait in the teams' lines of ``queue``."""
        teams = self.redis.smembers(teams_key(queue))
        with self.redis.pipeline(transaction=False) as pipe:
            for team in teams:
                pipe.llen(line_key(queue, team.decode()))
            return sum(pipe.execute()) if teams else 0

    def drop(self, queue: str, job_ids: list[str]) -> None:
        """Take jobs out of the lines of ``queue`` (their runs failed while they waited)."""
        for team in self.redis.smembers(teams_key(queue)):
            for job_id in job_ids:
                self.redis.lrem(line_key(queue, team.decode()), 0, job_id)

    def forget(self, queue: str) -> None:
        """``queue`` is gone (its node's): its lines go with it."""
        teams = [t.decode() for t in self.redis.smembers(teams_key(queue))]
        for team in teams:
            jobs = self.redis.smembers(f"{PREFIX}:{queue}:in:{team}")
            if jobs:
                self.redis.hdel(team_in_key(team), *jobs)
        self.redis.delete(teams_key(queue), *(line_key(queue, t) for t in teams),
                          *(f"{PREFIX}:{queue}:in:{t}" for t in teams))
        self.redis.srem(QUEUES, queue)


def line_key(queue: str, team: str) -> str:
    return f"{PREFIX}:{queue}:line:{team}"


def team_in_key(team: str) -> str:
    """The team's jobs waiting in any RQ queue (job id → the queue's key): what its cap on runs at once counts."""
    return f"{PREFIX}:team:{team}:in"


def teams_key(queue: str) -> str:
    return f"{PREFIX}:{queue}:teams"


class FairQueue(Queue):
    """An RQ queue whose fresh jobs of ``team`` pass its ``TeamGate``: RQ stores the job as ever, and the gate
    decides where its id waits (``push_job_id``)."""

    def __init__(self, name: str, gate: TeamGate, team: str, *, cap: int = 0, **kwargs: Any) -> None:
        super().__init__(name, connection=gate.redis, serializer=JSONSerializer, **kwargs)
        self.gate, self.team, self.cap = gate, team, cap

    def push_job_id(self, job_id: str, pipeline: Any = None, at_front: bool = False) -> None:
        self.gate.admit(self.name, self.team, job_id, at_front=at_front, cap=self.cap, client=pipeline)
