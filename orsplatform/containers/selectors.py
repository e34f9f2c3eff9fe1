"""Reads of container versions (the caller has already been admitted to the version)."""

from __future__ import annotations

from dataclasses import dataclass

from orsplatform.catalog.models import EnvironmentVersion
from orsplatform.containers.images import record_read


@dataclass(frozen=True)
class ImageView:
    image: str
    size_mb: float
    command: str
    layers: list[dict]  # {"size", "created_by"}, oldest first, as a Dockerfile reads


def version_image(*, version: EnvironmentVersion) -> ImageView | None:
    """The version's image as its page shows it: id, size, the command it runs and its layers."""
    record = record_read(version.package_path) if version.package_path else None
    if record is None:
        return None
    layers = [{"size": layer.get("size", ""), "created_by": layer.get("created_by", "")}
              for layer in reversed(record.layers)]
    return ImageView(image=record.image, size_mb=round(record.size / 1e6, 1), command=" ".join(record.command),
                     layers=layers)
