"""The kubelet-plugin kit: a driver's plugin from publishing its slices to stopped.

Driver-agnostic (nothing of the GPU driver in it: its devices come as a renderer of slices and
device names, its calls as a :class:`~dra_gpu.kubeletplugin.driver.Driver`). Start order, each
step needing the one before (the driver's composition root runs them):

1. :meth:`Kit.start_publishing`: the publisher (its API round trips overlap with the rest of
   start-up).
2. The driver restores its prepare state inside :meth:`Kit.exclusive` (the node-wide file lock,
   exclusively: no DRA call of this or another instance runs meanwhile).
3. :meth:`Kit.serve`: the DRA server on the DRA socket (DRAPlugin v1 + v1beta1 over the driver;
   DRAResourceHealth v1 + v1alpha1, grpc.health.v1), then the registration server on the
   registry socket. That must come last: the kubelet connects to the DRA endpoint as soon as
   registration succeeds. Then HTTP /healthz, when a port is configured: it makes a real call on
   each socket (``grpc_probe``).

Both sockets are served by grpcio (``grpcio_server``) with the limits below. grpc.health.v1
answers SERVING on both once the servers run and the slices were published, NOT_SERVING before
and from the moment ``stop`` begins.

:meth:`Kit.stop` is the reverse for the sockets: the registration socket goes first, so the
kubelet deregisters this instance (and, in a rolling update, switches to the other) before the
DRA socket closes; in-flight DRA calls get a grace period. Slices are left in place: another
instance or the next start takes them over, and the kubelet removes them when no instance of
the driver is left for 30 s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path

from dra_gpu.kubeletplugin import (
    call_lock,
    device_health,
    dra_service,
    grpc_probe,
    grpcio_server,
    healthz,
    publisher,
    registration,
    slice_plan,
    sockets,
)
from dra_gpu.kubeletplugin.driver import Driver, Step
from dra_gpu.kubeletplugin.rpc_methods import Method

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Options:
    """Where and as what the plugin runs. ``paths``: the sockets of the instance with a pod UID
    (None: the only instance), so another instance's can be found during a rolling update."""

    driver_name: str
    node_name: str
    pod_uid: str | None
    data_dir: Path
    paths: Callable[[str | None], sockets.SocketPaths]
    healthz_address: str = "127.0.0.1"
    healthz_port: int | None = None


DRA_GRACE_S = 10.0
# The DRA socket: the kubelet's prepare and unprepare calls (one per pod being started or
# stopped, all of a pod's claims in one call), one device health stream for as long as it is
# connected, and the /healthz probe. A node that starts its pods at once (64 small shares or
# MIG devices) sends that many calls at once on its one connection, possibly before it has read
# the server's stream limit: a lower per-connection limit refused such a burst (REFUSED_STREAM,
# seen with 64 prepares at once), so one connection may open 64. Beyond 128 in all a call is
# refused at once (RESOURCE_EXHAUSTED) and the kubelet retries the pod. The calls run on 16
# threads: their Python runs under one GIL, so more threads bought no throughput (64 prepares at
# once, 128 against 16 threads: 178 and 237 claims/s, medians of 6 bursts) but kept 62 threads'
# memory after a burst (+10.6 MiB RSS against +5.4 with 16); a health stream holds its thread,
# so at most 4 streams are served at once (the kubelet opens one).
DRA_LIMITS = grpcio_server.Limits(
    concurrent_rpcs=128, streams_per_connection=64, workers=16, streams=4
)
# The registration socket: the kubelet's GetInfo and NotifyRegistrationStatus, one at a time,
# and the /healthz probe.
REGISTRATION_LIMITS = grpcio_server.Limits(concurrent_rpcs=4, streams_per_connection=4)


class Kit:
    """A driver's kubelet plugin, from publishing to stopped (see the module docstring).

    ``render`` gives the ResourceSlices of ``device_names`` (the driver's); ``instance`` names
    this process among the publishers of the node.
    """

    def __init__(
        self,
        options: Options,
        *,
        store: publisher.SliceStore,
        render: publisher.Renderer,
        device_names: Sequence[str],
        instance: slice_plan.Instance,
    ) -> None:
        self._options = options
        self._paths = options.paths(options.pod_uid)
        self._stop = threading.Event()
        self.health = device_health.HealthFeed(pool=options.node_name)
        self.health.set_devices(device_names)
        self.publisher = publisher.Publisher(
            store=store,
            node=options.node_name,
            driver=options.driver_name,
            render=render,
            instance=instance,
            alive=self._instance_alive,
            on_synced=self._follow_health,
        )
        self._dra_server: grpcio_server.GrpcioServer | None = None
        self._reg_server: grpcio_server.GrpcioServer | None = None
        self._grpc_health = grpcio_server.health_servicer()
        self._probes = grpc_probe.SocketProbes(
            dra=self._paths.dra, registration_socket=self._paths.registration
        )
        self._healthz: healthz.HealthzServer | None = None
        # The driver's own reasons to be restarted (``watch_liveness``); set before serving.
        self._live_checks: list[healthz.Check] = []
        self._serving = False
        self._registered = threading.Event()

    @property
    def stop_event(self) -> threading.Event:
        return self._stop

    def _instance_alive(self, other: slice_plan.Instance) -> bool:
        """Whether another instance of this driver on this node still serves its registration
        socket (only rolling-update instances, named by pod UID, have one of their own)."""
        if other.name == self._options.pod_uid:
            return True
        if not sockets.POD_UID_PATTERN.match(other.name):
            return False  # a name no socket of ours can carry
        return sockets.accepts(self._options.paths(other.name).registration)

    def set_inventory(
        self,
        render: publisher.Renderer,
        device_names: Sequence[str],
        *,
        in_use: Collection[str] | None,
        faults: Mapping[str, str] | None = None,
    ) -> None:
        """A new inventory, or new faults: publish the slices and report the devices' health.

        ``in_use``: devices in prepared claims, which stay listed (UNHEALTHY) if they are gone;
        None when that is unknown, so every device that is gone stays listed. ``faults``: device
        name -> why it is unhealthy.
        """
        self.publisher.set_inventory(render)
        self.health.set_faults(faults or {})
        self.health.set_devices(device_names, in_use=in_use)

    def _state_problem(self) -> str | None:
        """Why the plugin is not healthy by what it knows of itself (grpc.health.v1 follows it:
        it cannot probe its own sockets, the probe's health check would ask itself)."""
        if not self._serving:
            return "gRPC servers are not serving"
        if not self.publisher.synced:
            return "ResourceSlices not published yet"
        return None

    def watch_liveness(self, check: healthz.Check) -> None:
        """Add a driver's reason to fail liveness (``/healthz``), so the kubelet restarts the
        plugin: for a state only a new process gets out of. Called before serving."""
        self._live_checks.append(check)

    def problem(self) -> str | None:
        """Why the plugin is not healthy, or None (liveness, /healthz): started and published,
        the driver's checks pass, and both sockets answer a real call now."""
        own = next((p for p in (check() for check in self._live_checks) if p), None)
        return self._state_problem() or own or self._probes.problem()

    def _follow_health(self) -> None:
        """Set grpc.health.v1 to what ``_state_problem`` says now.

        Called by ``serve`` and by the publisher's thread when the slices were first published.
        Each looks again after setting the status: when the two race, the one that read the
        older state sees the newer one and sets it again, so the last status set is the current
        one, with no lock held while the status reaches the watchers.
        """
        while True:
            serving = self._state_problem() is None
            grpcio_server.set_serving(self._grpc_health, serving)
            if (self._state_problem() is None) == serving:
                return

    def not_ready(self) -> str | None:
        """Why the plugin should not get calls yet (readiness), or None: healthy, and the kubelet
        confirmed the registration (it sends calls to the newest instance it registered)."""
        problem = self.problem()
        if problem is None and not self._registered.is_set():
            return "not registered with the kubelet yet"
        return problem

    def start_publishing(self) -> None:
        self.publisher.start(self._stop)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The node-wide lock, held exclusively: for the driver's start-up recovery.

        Recovery rolls back PrepareStarted records and sweeps temp files: in a rolling update,
        the other instance's call in progress looks exactly like a crash's leftovers. Under
        this lock (``held``: not shared with this instance's calls, unlike ``NodeCallLock``) it
        only ever sees what a finished call left.
        """
        self._options.data_dir.mkdir(parents=True, exist_ok=True)
        with call_lock.held(self._paths.lock):
            yield

    def serve(self, driver: Driver, steps: Sequence[Step] = ()) -> None:
        """Serve ``driver`` to the kubelet: DRA server (each call followed by ``steps``), then
        registration, then /healthz."""
        self._options.data_dir.mkdir(parents=True, exist_ok=True)
        self._dra_server = self._start_dra_server(driver, steps)
        self._reg_server = self._start_registration_server()
        self._serving = True
        self._follow_health()
        if self._options.healthz_port is not None:
            self._healthz = healthz.HealthzServer(
                address=self._options.healthz_address,
                port=self._options.healthz_port,
                live=self.problem,
                ready=self.not_ready,
            )
            self._healthz.start()

    def _serve(
        self, methods: list[Method], path: Path, *, limits: grpcio_server.Limits, name: str
    ) -> grpcio_server.GrpcioServer:
        """Serve ``methods`` (and grpc.health.v1) on the unix socket ``path``."""
        server = grpcio_server.GrpcioServer(
            methods, health=self._grpc_health, limits=limits, name=name
        )
        temporary = sockets.listen_private(path, server.add_address)
        server.start()
        sockets.publish(temporary, path)
        log.info("listening on %s", path)
        return server

    def _start_dra_server(
        self, driver: Driver, steps: Sequence[Step]
    ) -> grpcio_server.GrpcioServer:
        methods = dra_service.methods(driver, steps) + device_health.methods(self.health)
        return self._serve(methods, self._paths.dra, limits=DRA_LIMITS, name="dra")

    def _start_registration_server(self) -> grpcio_server.GrpcioServer:
        service = registration.Registration(
            driver_name=self._options.driver_name,
            dra_endpoint=self._paths.dra,
            on_registered=self._registered.set,
        )
        return self._serve(
            service.methods(), self._paths.registration, limits=REGISTRATION_LIMITS, name="reg"
        )

    def stop(self) -> None:
        """Remove our sockets and stop serving; safe to call more than once."""
        self._serving = False
        # NOT_SERVING for good (later sets are ignored), to callers and watchers alike.
        self._grpc_health.enter_graceful_shutdown()
        sockets.remove(self._paths.registration)
        if self._reg_server is not None:
            self._reg_server.stop(grace=1.0)
        self.health.close()
        if self._dra_server is not None:
            self._dra_server.stop(grace=DRA_GRACE_S)
        sockets.remove(self._paths.dra)
        self._stop.set()
        if self._healthz is not None:
            self._healthz.stop()
        self._probes.close()
        log.info("stopped; sockets removed")
