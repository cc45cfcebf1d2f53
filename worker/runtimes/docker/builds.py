"""The Docker runtime's dependency environments: its target (the sandbox image's ``python3``) and its builds, each
step in a throwaway container of that image.

``DockerTargets`` asks the sandbox image what its interpreter is (and, for Node environments, its ``node``), once
per image id, with a throwaway container; the image's id is part of the target, so an image built anew gets
environments of its own.

``ContainerSteps`` runs a build step (``worker.environments.steps.StepRunner``) the way a run is contained, plus
a way to the package index: a new container of the sandbox image per step, as the build's unprivileged user id,
every capability dropped, no-new-privileges, a read-only root with a private ``/tmp``, memory and process limits, no
network (``network_mode="none"``: loopback alone), an environment made from scratch (proxy settings of the Docker
client included: none). It is shown the build's folder (read-write, at its host path, so the environment it makes
has the path runs will see), the ``uv`` binary (for a ``uv`` step; an ``npm`` step runs the image's own) and the
configured CA bundle (both read-only, ``SSL_CERT_FILE`` and ``NODE_EXTRA_CA_CERTS`` naming the bundle) and
nothing else of the host. At its timeout or on cancel the container is killed and removed
with everything in it; a coreutils ``timeout`` inside stops it too should the worker die first, and containers such
a worker left are removed by the next runner.

Its way out is the worker's allow-list proxy (``worker.egress.proxy``), served for the step on a unix
socket the worker makes in the build folder, reached through the relay of ``worker.egress.relay`` (as runs with
an egress allow-list reach theirs). It needs no more of the engine than the build folder's bind mount does (no host
PID namespace, no root worker).

``docker_environments`` puts them together with the environment store into the runtime's ``SkillEnvironments``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shlex
import threading
import time
from collections.abc import Callable
from pathlib import Path

import docker
import docker.errors
from docker.types import LogConfig

from worker import defaults
from worker.cancellation import Cancellation
from worker.config import get_worker_settings
from worker.egress.policy import AllowList
from worker.egress.proxy import PROXY_PORT, proxy_environment
from worker.egress.relay import RELAY
from worker.egress.serving import serving_folder
from worker.environments import BuildSettings, EnvironmentBuilder, EnvironmentStore, SkillEnvironments, build_settings
from worker.environments.steps import BUILD_PROCESSES, OUTPUT_BYTES, StepRunner, installed_uv
from worker.environments.target import NODE_PROBE, PROBE, NodeTarget, Target
from worker.errors import DependencyError
from worker.outcome import TIMEOUT_EXIT_CODE, ProcessOutcome
from worker.runtimes.docker.host import RESIDENT_UID
from worker.runtimes.docker.engine import ENGINE_ERRORS, engine_time, map_docker_errors

Client = Callable[[], docker.DockerClient]

UV_PATH = "/opt/skillrun/bin/uv"
"""Where a build container finds the ``uv`` binary (mounted read-only)."""
CA_BUNDLE_PATH = "/opt/skillrun/ca-bundle.crt"
"""Where a build container finds the configured CA bundle (mounted read-only; ``SSL_CERT_FILE``)."""
BUILD_LABEL = "skillrun.build"
"""Labels a build container with its build folder's path."""
BUILD_NAMES = "^skillrun-(build|debian)-"
"""The names of build containers: environment steps' and derived images' (``container_images``)."""
BUILD_TMPFS_BYTES = 64 * 1024 * 1024
"""The build container's ``/tmp`` (the build's own temporary folder is in its build folder)."""
POLL_SECONDS = 0.1
TIMEOUT_SLACK_SECONDS = 30
"""The in-container ``timeout`` fires this long after the runner's own (it only matters if the worker died)."""
LEFTOVER_SECONDS = 600.0
"""A build container stopped this long ago is a dead worker's leftover (a live one removes its own at once)."""
TARGET_REFRESH_SECONDS = 30.0
"""How long the sandbox image's id is trusted before it is looked up again (an image built anew under its tag)."""
class DockerTargets:
    """The Docker runtime's target (call it): the sandbox image's ``python3``, its id looked up at most every
    ``TARGET_REFRESH_SECONDS`` and its interpreter probed once per id. Safe to call from any thread; a caller on an
    event loop calls it in a thread (``asyncio.to_thread``) when it may have to look."""

    def __init__(self, client: Client, image: str) -> None:
        self.client = client
        self.image = image
        self._lock = threading.Lock()
        self._current: Target | None = None
        self._checked = 0.0
        self._probed: dict[str, Target | DependencyError] = {}  # image id → its target, or why it has none
        self._node_probed: dict[str, NodeTarget | DependencyError] = {}

    @property
    def stale(self) -> bool:
        """Whether a call would ask the engine (the image's id is not known, or not recently)."""
        return self._current is None or time.monotonic() - self._checked >= TARGET_REFRESH_SECONDS

    def __call__(self) -> Target:
        with self._lock:
            if not self.stale:
                return self._current
            with map_docker_errors(f"looking up the sandbox image {self.image}"):
                image_id = self.client().images.get(self.image).id
            if image_id not in self._probed:
                try:
                    self._probed[image_id] = self._probe(image_id)
                except DependencyError as exc:
                    self._probed[image_id] = exc  # asked once per image: the image will not change its mind
            found = self._probed[image_id]
            if isinstance(found, DependencyError):
                raise found
            self._current, self._checked = found, time.monotonic()
            return found

    def node(self) -> NodeTarget:
        """The sandbox image's ``node`` as a Node environments' target (probed once per image id)."""
        image_id = self().image
        with self._lock:
            if image_id not in self._node_probed:
                try:
                    self._node_probed[image_id] = self._probe_node(image_id)
                except DependencyError as exc:
                    self._node_probed[image_id] = exc
            found = self._node_probed[image_id]
        if isinstance(found, DependencyError):
            raise found
        return found

    def _probe_node(self, image_id: str) -> NodeTarget:
        script = f"command -v npm >/dev/null || {{ echo 'no npm' >&2; exit 1; }}; exec node -e {shlex.quote(NODE_PROBE)}"
        answer = self._ask(image_id, ["sh", "-c", script], "node", "Node dependencies need node and npm",
                           "images/base/packages.txt lists nodejs and npm; run images/build.sh")
        return NodeTarget.from_probe("docker", answer, image=image_id)

    def _probe(self, image_id: str) -> Target:
        """Ask ``python3`` in a throwaway container of the image (no network, nothing mounted) what it is."""
        answer = self._ask(image_id, ["python3", "-I", "-c", PROBE], "python3", "Python dependencies need python3",
                           "add python3 to images/base/packages.txt and run images/build.sh")
        return Target.from_probe("docker", answer, image=image_id)

    def _ask(self, image_id: str, command: list[str], what: str, need: str, fix: str) -> str:
        """``command``'s output in a throwaway container of the image (no network, nothing mounted);
        ``DependencyError`` saying ``need`` and ``fix`` with its own words when it fails."""
        try:
            with map_docker_errors(f"asking the sandbox image {self.image} for its {what}"):
                answer = self.client().containers.run(
                    image_id, command, remove=True, network_mode="none", user=f"{RESIDENT_UID}:{RESIDENT_UID}",
                    cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True,
                    environment={"PATH": defaults.SANDBOX_PATH, "LANG": defaults.SANDBOX_LANG},
                    use_config_proxy=False, stdout=True, stderr=True,
                )
        except docker.errors.ContainerError as exc:
            raise DependencyError(
                f"skills with {need} in the sandbox image {self.image}: "
                f"{(exc.stderr or b'').decode(errors='replace').strip()[-300:]} ({fix})"
            ) from exc
        return answer.decode(errors="replace")


class ContainerSteps(StepRunner):
    """Build steps in throwaway containers of the target's image (see the module's description)."""

    def __init__(self, client: Client, *, ca_bundle: str | None, memory_bytes: int,
                 allowed_hosts: str | None = None) -> None:
        """``allowed_hosts``: what steps may reach besides the index (default: ``SKILLRUN_ENV_ALLOWED_HOSTS``)."""
        self.client = client
        self.ca_bundle = ca_bundle
        self.memory_bytes = memory_bytes
        self.allowed_hosts = allowed_hosts
        self._swept = False

    async def run(self, folder: Path, uid: int | None, args: list[str], env: dict[str, str], *,
                  target: Target | NodeTarget, timeout: float, cancel: Cancellation,
                  tool: str = "uv") -> ProcessOutcome:
        started = time.monotonic()
        async with serving_folder(AllowList.for_step(env, self.allowed_hosts), folder, uid) as (_, name):
            container = await asyncio.to_thread(self._start, folder, uid, args, env, target, timeout, name, tool)
            try:
                state = await self._wait(container, started + timeout, cancel)
                return await asyncio.to_thread(self._outcome, container, state, started)
            finally:
                await asyncio.to_thread(self._remove, container)

    def _start(self, folder: Path, uid: int | None, args: list[str], env: dict[str, str], target: Target | NodeTarget,
               timeout: float, proxy_socket: str, tool: str) -> str:
        """Start the step's container: ``<tool> <args>`` under the relay to ``proxy_socket`` (its name in
        ``folder``)."""
        client = self.client()
        if not self._swept:
            self._sweep(client)
        volumes = {str(folder): {"bind": str(folder), "mode": "rw"}}
        if tool == "uv":
            volumes[str(installed_uv())] = {"bind": UV_PATH, "mode": "ro"}
        if self.ca_bundle:
            volumes[self.ca_bundle] = {"bind": CA_BUNDLE_PATH, "mode": "ro"}
            env = {**env, "SSL_CERT_FILE": CA_BUNDLE_PATH, "NODE_EXTRA_CA_CERTS": CA_BUNDLE_PATH}
        user = f"{uid}:{uid}" if uid is not None else f"{os.getuid()}:{os.getgid()}"
        backstop = ["timeout", "-s", "KILL", str(int(timeout) + TIMEOUT_SLACK_SECONDS)]
        python, program = (target.python, UV_PATH) if isinstance(target, Target) else ("python3", "npm")
        relay = [python, "-I", "-c", RELAY, proxy_socket, str(PROXY_PORT), program, *args]
        with map_docker_errors("starting a build container"):
            container = client.containers.run(
                target.image, [*backstop, *relay], name=f"skillrun-build-{secrets.token_hex(6)}",
                detach=True, init=True, user=user, environment={**env, **proxy_environment()},
                working_dir=str(folder), labels={BUILD_LABEL: str(folder)}, network_mode="none", cap_drop=["ALL"],
                security_opt=["no-new-privileges"], read_only=True, ipc_mode="private",
                tmpfs={"/tmp": f"size={BUILD_TMPFS_BYTES},mode=1777,nosuid,nodev"}, mem_limit=self.memory_bytes,
                memswap_limit=self.memory_bytes, pids_limit=BUILD_PROCESSES, volumes=volumes,
                log_config=LogConfig(type=LogConfig.types.JSON, config={"max-size": "1m", "max-file": "1"}),
                use_config_proxy=False,
            )
        return container.id

    async def _wait(self, container: str, deadline: float, cancel: Cancellation) -> dict | None:
        """The container's state once it has exited, or ``None`` when it was killed at the deadline or on cancel
        (``cancel`` is set then)."""
        api = self.client().api
        while True:
            with map_docker_errors("following a build container"):
                state = await asyncio.to_thread(api.inspect_container, container)
            if not state["State"]["Running"]:
                return state["State"]
            if cancel.is_set() or time.monotonic() >= deadline:
                with contextlib.suppress(*ENGINE_ERRORS):
                    await asyncio.to_thread(api.kill, container)
                return None
            await asyncio.sleep(POLL_SECONDS)

    def _outcome(self, container: str, state: dict | None, started: float) -> ProcessOutcome:
        api = self.client().api
        logs = {}
        for stream in ("stdout", "stderr"):
            try:
                logs[stream] = api.logs(container, stdout=stream == "stdout", stderr=stream == "stderr")
            except ENGINE_ERRORS:
                logs[stream] = b""
        stopped = state is None
        return ProcessOutcome(
            stdout=logs["stdout"][-OUTPUT_BYTES:], stderr=logs["stderr"][-OUTPUT_BYTES:],
            stdout_omitted=max(len(logs["stdout"]) - OUTPUT_BYTES, 0),
            stderr_omitted=max(len(logs["stderr"]) - OUTPUT_BYTES, 0),
            exit_code=TIMEOUT_EXIT_CODE if stopped else state["ExitCode"], timed_out=stopped, cancelled=False,
            duration_ms=int((time.monotonic() - started) * 1000), notes=[],
            oom_killed=bool(state and state.get("OOMKilled")),
        )

    def _remove(self, container: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            with map_docker_errors("removing a build container"):
                self.client().api.remove_container(container, force=True)

    def _sweep(self, client: docker.DockerClient) -> None:
        """Remove build containers a dead worker left (stopped for ``LEFTOVER_SECONDS``; a live worker removes its
        own as soon as they stop)."""
        self._swept = True
        with map_docker_errors("looking for leftover build containers"):
            found = client.api.containers(all=True, filters={"name": BUILD_NAMES, "status": "exited"})
        for summary in found:
            with contextlib.suppress(*ENGINE_ERRORS):
                finished = client.api.inspect_container(summary["Id"])["State"]["FinishedAt"]
                if time.time() - engine_time(finished) > LEFTOVER_SECONDS:
                    client.api.remove_container(summary["Id"], force=True)


def docker_environments(default_root: Path, client: Client, targets: DockerTargets,
                        settings: BuildSettings | None = None) -> SkillEnvironments:
    """The Docker runtime's environments: kept in ``SKILLRUN_ENVS_DIR`` or else ``default_root`` (the same store
    as the local runtime's; keys differ by target), built for the ``targets`` image's ``python3`` in containers of
    it, each as a sandbox user id of its own on a root host."""
    settings = settings or build_settings(sandboxed=os.geteuid() == 0)
    store = EnvironmentStore(get_worker_settings().envs_dir or default_root)
    steps = ContainerSteps(client, ca_bundle=settings.ca_bundle, memory_bytes=settings.memory_bytes)
    return SkillEnvironments(EnvironmentBuilder(store, settings, steps=steps), targets, targets.node)


__all__ = ["ContainerSteps", "DockerTargets", "docker_environments"]
