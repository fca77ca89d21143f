"""The most of each capacity any published device of the driver has, per DeviceClass, for the
webhook: a request asking more than that can never be allocated.

:func:`largest` is pure (slices in, amounts out). :class:`PublishedCapacity` lists this driver's
ResourceSlices when its answer is older than ``max_age_s``, on the thread of the review that
needs it (no thread of its own; the list runs outside the lock, which guards only the cached
answer). One list at a time: reviews that come while it runs take the last answer (None before
the first: no check) instead of listing too; in a large cluster one list is every slice of the
driver (hundreds of MiB with dynamic MIG), and at tens of claim creates per second each review
of a stale period listing them would be the API server's load. When the list fails, the last
answer is kept (or None: no check), so an API problem never refuses a claim.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from dra_gpu import DRIVER_NAME
from dra_gpu.config.quantity import QuantityError, to_bytes
from dra_gpu.kube.client import KubeClient
from dra_gpu.kube.errors import ApiError

log = logging.getLogger(__name__)

# Device type attribute -> the DeviceClass whose selector picks that type.
CLASS_OF_TYPE: Final = {"gpu": "gpu.nvidia.com", "mig": "mig.nvidia.com"}
SLICES_PATH: Final = "/apis/resource.k8s.io/v1/resourceslices"
MAX_AGE_S: Final = 30.0
LIST_TIMEOUT_S: Final = 5.0  # the API server waits for the webhook (10 s by default)

# DeviceClass -> capacity name -> the most any published device of that class has.
Largest = Mapping[str, Mapping[str, int]]


def largest(
    slices: Iterable[Mapping[str, Any]], *, driver: str = DRIVER_NAME
) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        for device in spec.get("devices") or ():
            kind = ((device.get("attributes") or {}).get("type") or {}).get("string")
            device_class = CLASS_OF_TYPE.get(str(kind))
            if device_class is None:
                continue
            most = out.setdefault(device_class, {})
            for name, entry in (device.get("capacity") or {}).items():
                try:
                    value = to_bytes(str((entry or {}).get("value")))
                except QuantityError:
                    continue
                most[name] = max(most.get(name, 0), value)
    return out


class PublishedCapacity:
    def __init__(
        self,
        fetch: Callable[[], list[Mapping[str, Any]]],
        *,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch, self._max_age_s, self._clock = fetch, max_age_s, clock
        self._lock = threading.Lock()
        self._answer: Largest | None = None
        self._at: float | None = None
        self._listing = False  # a review's thread is listing: the others take the last answer

    @classmethod
    def of(cls, client: KubeClient) -> PublishedCapacity:
        def fetch() -> list[Mapping[str, Any]]:
            body = client.request(
                "GET",
                SLICES_PATH,
                query={"fieldSelector": f"spec.driver={DRIVER_NAME}"},
                timeout_s=LIST_TIMEOUT_S,
            )
            return list(body.get("items") or ())

        return cls(fetch)

    def get(self) -> Largest | None:
        with self._lock:
            fresh = self._at is not None and self._clock() - self._at < self._max_age_s
            if fresh or self._listing:
                return self._answer
            self._listing = True
            answer = self._answer
        try:
            answer = largest(self._fetch())
        except (ApiError, OSError) as exc:
            log.warning("cannot list the published devices (capacity check skipped): %s", exc)
        finally:
            with self._lock:
                self._answer, self._at, self._listing = answer, self._clock(), False
        return answer
