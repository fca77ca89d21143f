"""Export the config kinds as JSON Schema files into ``api/config/v1beta1/``.

Run ``python -m dra_gpu.config.schema`` after changing a model; ``--check`` exits 1 when the
committed files differ from the models (a unit test does the same). The files are for users
and tooling (editors, policy engines); validation in this project always goes through
:func:`dra_gpu.config.parse_opaque_config`, which also enforces the cross-field rules JSON
Schema cannot express (one strategy's sub-config only).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel

from dra_gpu.config import v1beta1

DEFAULT_DIR: Final = Path(__file__).resolve().parents[2] / "api" / "config" / v1beta1.VERSION

_MODELS: Final[dict[str, type[BaseModel]]] = {
    "gpuconfig.json": v1beta1.GpuConfig,
    "migdeviceconfig.json": v1beta1.MigDeviceConfig,
}


def schemas() -> dict[str, dict[str, Any]]:
    """File name -> JSON Schema document for every kind."""
    out: dict[str, dict[str, Any]] = {}
    for name, model in _MODELS.items():
        schema = model.model_json_schema()
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://{v1beta1.GROUP}/{v1beta1.VERSION}/{name}"
        out[name] = schema
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale: list[str] = []
    for name, schema in schemas().items():
        path: Path = args.dir / name
        text = render(schema)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("out of date (run python -m dra_gpu.config.schema):", *stale, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
