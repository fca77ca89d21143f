"""``dra-gpu discover``: what this node would publish, without a cluster.

``-o table`` is for people (one row a device); ``-o json`` / ``-o yaml`` / ``-o resourceslices``
print the ResourceSlice objects exactly as the kubelet plugin publishes them (same builder,
``published.node_slices``, same names), as a ``v1 List`` in JSON and a multi-document stream in
YAML (``resourceslices`` is the YAML stream under the name an autoscaler's docs use), so either
can be fed to ``kubectl create --dry-run=server -f -``. ``-o karpenter`` prints the same slices as
Karpenter's ``ResourceSliceTemplate`` list (``plugin.slice_templates``).

The plugin settings that change the slices (:data:`SLICE_SETTINGS`: driver name, MIG mode, MPS
support, consumable shares) are flags here too, parsed by the plugin's own ``build_settings`` from
the flag or the plugin's environment variable, so ``discover`` in the plugin's pod prints that
pod's slices and ``discover --simulate PROFILE --node NAME ...`` predicts a node scaled up from
zero (docs/user/autoscaling.md).

Imports stay light on purpose: without ``--simulate`` only pynvml is needed (no pydantic, no
yaml, no Kubernetes client), so the command runs on a bare GPU host.

Exit status: 0 when every GPU was read, 1 when any GPU (or the backend) failed — the devices
that could be read are still printed, the failures are logged on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dra_gpu
from dra_gpu.devices import naming
from dra_gpu.devices import shares as device_shares
from dra_gpu.devices.model import CAP_MEMORY, Device, Discovery, GpuBackend
from dra_gpu.plugin import published
from dra_gpu.plugin import settings as plugin_settings

# The kubelet plugin's settings that change what its ResourceSlices hold (Settings field names;
# each also read from the plugin's environment variable, plugin_settings.ENV_VARS).
SLICE_SETTINGS = ("driver_name", "mig_mode", "mps_support", "consumable_shares")
OUTPUTS = ("table", "json", "yaml", "resourceslices", "karpenter")


def default_node_name() -> str:
    return os.environ.get("NODE_NAME") or socket.gethostname().lower()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "discover",
        help="show the GPUs and MIG devices this node would publish",
        description="Discover GPUs (NVML, or a simulated profile) and print the devices or the "
        "ResourceSlices the plugin would publish.",
    )
    p.add_argument(
        "--simulate",
        metavar="PROFILE|PATH",
        help="use a simulated profile (h200x8, h100x8, a100x4-mig) or a profile file "
        "instead of NVML",
    )
    p.add_argument(
        "--node",
        "--node-name",
        dest="node_name",
        default=None,
        help="node name: names the pool and the slices, seeds simulated UUIDs "
        "(default: $NODE_NAME or hostname)",
    )
    p.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="table",
        help="table; json, yaml or resourceslices: the ResourceSlices the plugin publishes; "
        "karpenter: the same as Karpenter ResourceSliceTemplates",
    )
    p.add_argument(
        "--driver-name",
        default=None,
        help=f"DRA driver name (default: $DRIVER_NAME, else {dra_gpu.DRIVER_NAME})",
    )
    p.add_argument(
        "--mig-mode",
        default=None,
        metavar="MODE",
        help="static or dynamic, as the plugin's --mig-mode (default: $MIG_MODE, else static)",
    )
    p.add_argument(
        "--mps-support",
        default=None,
        metavar="BOOL",
        help="true: shares also carry compute, as the plugin's --mps-support "
        "(default: $MPS_SUPPORT, else false)",
    )
    p.add_argument(
        "--binding-conditions",
        default="true",
        metavar="BOOL",
        help="with --mig-mode dynamic: true (default) prints the MIG devices' binding conditions, "
        "as a node publishes them where the API server serves them (Kubernetes 1.36 and later); "
        "false: as on 1.34 and 1.35",
    )
    p.add_argument(
        "--driver-root",
        type=Path,
        default=None,
        metavar="PATH",
        help="root of the NVIDIA driver installation; NVML is loaded from under it "
        "(default: $DRIVER_ROOT, else /)",
    )
    p.add_argument(
        "--nvml-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="give up on an NVML call after this long (default 10)",
    )
    p.add_argument(
        "--consumable-shares",
        default=None,
        metavar="MODE",
        help="print the slices as a node in this share mode publishes them: memory, unlimited "
        "or an integer (default: $CONSUMABLE_SHARES, else disabled; compute with "
        "--mps-support true, as the plugin)",
    )
    p.set_defaults(func=run)


def default_driver_root() -> Path:
    """``$DRIVER_ROOT`` (set in the plugin's pod, so ``dra-gpu discover`` there just works)."""
    return Path(os.environ.get("DRIVER_ROOT") or "/")


def make_backend(
    *,
    simulate: str | None,
    node_name: str,
    nvml_timeout_s: float,
    driver_root: Path = Path("/"),
    mig_dynamic: bool = False,
) -> GpuBackend:
    """The plugin's own choice of backend (a test replaces this to inject a fake NVML)."""
    from dra_gpu.plugin import inventory, platforms

    platform = platforms.for_node(
        simulate=simulate,
        node_name=node_name,
        driver_root=driver_root,
        nvml_timeout_s=nvml_timeout_s,
    )
    return inventory.backend_for(platform, mig_dynamic=mig_dynamic)


def slice_settings(
    values: Mapping[str, object], env: Mapping[str, str]
) -> plugin_settings.Settings:
    """The plugin's settings from discover's flags (``vars(args)``) and the slice settings'
    environment variables only, parsed as the plugin parses them; raises SettingsError."""
    wanted = {plugin_settings.ENV_VARS[k] for k in (*SLICE_SETTINGS, "node_name")}
    return plugin_settings.build_settings(
        {k: values.get(k) for k in (*SLICE_SETTINGS, "node_name")},
        {k: v for k, v in env.items() if k in wanted},
    )


def render_table(devices: Sequence[Device]) -> str:
    header = ("NAME", "TYPE", "PRODUCT", "MEMORY", "MIG PROFILE", "UUID")
    rows = [header] + [
        (
            d.name,
            d.type,
            d.gpu.product_name,
            f"{d.capacity[CAP_MEMORY] / 2**30:.1f} GiB",
            d.mig.profile if d.mig else "-",
            d.uuid or "-",
        )
        for d in devices
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if not devices:
        lines.append("(no devices)")
    return "\n".join(lines)


def render(
    output: str,
    *,
    devices: Sequence[Device],
    node_name: str,
    shares: device_shares.ShareMode | None = None,
    driver_name: str = dra_gpu.DRIVER_NAME,
    binding: bool = False,
) -> str:
    """``binding``: the dynamic MIG devices carry their binding conditions (the plugin adds them
    where the API server serves them; ``discover`` cannot ask a server, so it is told)."""
    if output == "table":
        return render_table(devices)
    objs = published.node_slices(
        devices,
        driver_name=driver_name,
        node_name=node_name,
        node_uid=None,
        pool_generation=published.FIRST_GENERATION,
        shares=shares,
        binding=published.mig_binding_conditions(driver_name) if binding else None,
    )
    if output == "json":
        doc: dict[str, Any] = {"apiVersion": "v1", "kind": "List", "items": objs}
        return json.dumps(doc, indent=2)
    import yaml  # only for the YAML outputs

    if output == "karpenter":
        from dra_gpu.plugin import slice_templates

        head = f"# {slice_templates.SHAPE}: the ResourceSlices of node {node_name}\n"
        body = yaml.safe_dump(slice_templates.karpenter_templates(objs), sort_keys=False)
        return head + str(body).rstrip("\n")
    return str(yaml.safe_dump_all(objs, sort_keys=False)).rstrip("\n")


def run(args: argparse.Namespace) -> int:
    from dra_gpu.plugin.inventory import InventoryError

    logging.basicConfig(stream=sys.stderr, format="dra-gpu discover: %(levelname)s: %(message)s")
    node_name = args.node_name or default_node_name()
    try:
        settings = slice_settings({**vars(args), "node_name": node_name}, os.environ)
    except plugin_settings.SettingsError as e:
        print(f"dra-gpu discover: {e}", file=sys.stderr)
        return 2
    try:
        binding = plugin_settings.switch(str(args.binding_conditions), "--binding-conditions")
    except plugin_settings.SettingsError as e:
        print(f"dra-gpu discover: {e}", file=sys.stderr)
        return 2
    try:
        backend = make_backend(
            simulate=args.simulate,
            node_name=node_name,
            nvml_timeout_s=args.nvml_timeout,
            driver_root=args.driver_root or default_driver_root(),
            mig_dynamic=settings.mig_mode == "dynamic",
        )
    except InventoryError as e:  # unknown profile, bad profile file
        print(f"dra-gpu discover: {e}", file=sys.stderr)
        return 2
    discovery: Discovery = backend.discover()
    try:
        devices = naming.build_devices(discovery.gpus)
    except ValueError as e:
        print(f"dra-gpu discover: {e}", file=sys.stderr)
        return 1
    print(
        render(
            args.output,
            devices=devices,
            node_name=node_name,
            shares=settings.consumable_shares,
            driver_name=settings.driver_name,
            binding=settings.mig_mode == "dynamic" and binding,
        )
    )
    if discovery.errors:
        print(
            f"dra-gpu discover: {len(discovery.errors)} problem(s): "
            + "; ".join(str(e) for e in discovery.errors),
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dra_gpu.discover_cmd [options]``: the same command without the other
    subcommands' imports (for a bare GPU host that has only pynvml)."""
    parser = argparse.ArgumentParser(prog="dra-gpu")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["discover", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
